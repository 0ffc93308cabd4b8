"""Development tools around the seqcls library — never imported by the product.

- ``seqcls_tools.demo``: the demo dataset, trainer, ``seqcls demo`` runner and Airflow UI stack;
- ``seqcls_tools.bench``: the serving benchmark (``seqcls bench``);
- ``seqcls_tools.testing``: tiny random PaddleNLP checkpoints for plumbing tests;
- ``seqcls_tools.cli``: the ``seqcls`` subcommands above (``add_commands``).

These modules may import ``seqcls``; ``seqcls`` itself imports none of them
(``tests/test_layout.py`` holds that line), so the release steps and Airflow's plugin loader
never see them. They are their own distribution, ``seqcls-tools`` (``tools/pyproject.toml``),
installed editable beside ``seqcls`` by ``make setup`` and never part of the product's wheel.
"""
