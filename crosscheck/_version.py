"""crosscheck's version: a leaf, so that ``availability.versions`` reads it without importing the package façade
(``crosscheck/__init__``, which imports the run, which imports ``availability``)."""

__version__ = "0.1.0"
