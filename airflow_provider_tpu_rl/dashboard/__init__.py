"""The runs dashboard inside Airflow: the ledger's runs, each run's curves, the reward trend.

``plugin`` registers it (entry point ``airflow.plugins``); ``pages`` renders the HTML (no Airflow
import), ``reads`` reads the ledger and the curves' PNG, ``fastapi_app`` serves it on Airflow 3's
API server and ``flask_views`` on Airflow 2's webserver, both behind Airflow's own auth.
"""
