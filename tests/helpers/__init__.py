"""What several test modules share — fixtures, builders, constants — one module per concept.

Test modules import shared code only from here, never from one another. Fixtures every module may
use live in ``tests/conftest.py``; the fixtures here are imported by the modules that want them
(``from tests.helpers.airflow import airflow_db``), so that an autouse one applies only there.
"""
