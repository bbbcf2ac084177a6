"""crosscheck's version: a leaf, so that ``environment.versions`` reads it without importing the package façade
(``crosscheck/__init__``, which imports the run, which imports ``environment``)."""

__version__ = "0.1.0"
