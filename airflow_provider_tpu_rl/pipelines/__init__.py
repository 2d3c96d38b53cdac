"""How the shipped pipeline DAGs are assembled: the trigger form, ``validate``, the task arguments
taken from its XCom, the graph's groups and bounds, the watcher. The DAG files in ``dags/`` only
list their tasks; the operators they use are the building blocks any DAG can use."""
