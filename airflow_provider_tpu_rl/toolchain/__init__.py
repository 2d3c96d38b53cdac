"""The tool runtime: running one command (``process``), the tools gcluster needs, found or installed
and verified (``tools``, ``bundle``), gcluster's own dependency and job-prerequisite checks, the
credentials ``gcluster job`` finds (``adc``), and reading a command's output (``failures``,
``job_output``)."""
