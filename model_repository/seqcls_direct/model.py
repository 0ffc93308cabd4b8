"""Triton python model ``seqcls`` in the *direct* layout: tokenize → ONNX → decide in one python model.

The classic ensemble hands every request through three python stubs (``tokenizer`` →
``seqcls_model`` → ``seqcls_postprocess``); each hand-off is a round trip through the python
backend's shared memory and a wake-up of another process, which a lone request pays three times.
This model runs the *same three step classes* — their own ``model.py`` files, their own
``release.json`` and files, each in a sub-directory of this version (``tokenizer/``, ``model/``,
``postprocess/``) — one after the other inside one stub, passing their ``pb_utils`` responses on as
the next step's requests. So answers, refusals (``INVALID_ARG``, one bad request fails only itself)
and metrics are the classic steps', by construction, and the inputs/outputs are the ensemble's
(``TEXT`` → ``predictions``, ``probabilities``).

Each step's ``model_config`` is what ``steps.json`` holds for it (the config seqcls rendered for that
composing model: padding, batching, ORT threads, …), so a step sees what it sees as its own model.
Selected with ``SEQCLS_SERVING_PIPELINE=direct``; publish writes the step directories (hard links to
the composing models' files of the same version) and ``steps.json``.
"""

import importlib.util
import json
import os
import sys

import triton_python_backend_utils as pb_utils

STEPS_FILE = "steps.json"
#: The steps in order, each in the version's sub-directory of that name.
STEPS = ("tokenizer", "model", "postprocess")


def _load_step(directory, role):
    """The step's ``TritonPythonModel`` class, from ``<directory>/model.py`` under a module name of its own."""
    sys.path.insert(0, directory)  # its seqcls_*.py helpers (identical in every step of one release)
    spec = importlib.util.spec_from_file_location(f"seqcls_direct_{role}", os.path.join(directory, "model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


def _forward(responses, role):
    """The next step's requests from ``responses``: ``(index, request)`` for each answered one."""
    out = []
    for i, response in enumerate(responses):
        if response.has_error():
            continue
        inputs = response.output_tensors()
        out.append((i, pb_utils.InferenceRequest(model_name=role, inputs=inputs, requested_output_names=[])))
    return out


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, STEPS_FILE), encoding="utf-8") as fh:
            configs = json.load(fh)
        missing = [role for role in STEPS if role not in configs or not os.path.isdir(os.path.join(version_dir, role))]
        if missing:
            raise pb_utils.TritonModelException(
                f"seqcls (direct): {STEPS_FILE} or the step directories lack {missing}; publish the release again"
            )
        self.steps = []
        for role in STEPS:
            directory = os.path.join(version_dir, role)
            step = _load_step(directory, role)()
            step.initialize(
                {**args, "model_repository": directory, "model_version": "", "model_config": json.dumps(configs[role])}
            )
            self.steps.append(step)

    def execute(self, requests):
        answers = list(self.steps[0].execute(requests))
        for step in self.steps[1:]:
            passed = _forward(answers, type(step).__module__)
            if not passed:
                break
            for (i, _), response in zip(passed, step.execute([r for _, r in passed]), strict=True):
                answers[i] = response
        return answers

    def finalize(self):
        for step in self.steps:
            step.finalize()
