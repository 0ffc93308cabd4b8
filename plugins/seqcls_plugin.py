"""Airflow discovers plugins in this folder: this module registers the ``seqcls`` plugin.

Everything lives in the ``seqcls`` package (``seqcls.airflow.plugin``); the plugins folder is on
``sys.path`` for Airflow, and the package is also installed (``pip install -e .``).
"""

from seqcls.airflow.plugin import SeqclsPlugin

__all__ = ["SeqclsPlugin"]
