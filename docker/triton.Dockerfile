# Triton Inference Server 2.51 (NGC 24.10) + what seqcls's python-backend models import.
# The ONNX model runs in the image's native `onnxruntime` backend; only the `tokenizer` and
# `seqcls_postprocess` python models need extra packages. Build context: docker/.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

COPY requirements-triton.txt /tmp/requirements-triton.txt
RUN python3 -m pip install --no-cache-dir -r /tmp/requirements-triton.txt \
 && rm /tmp/requirements-triton.txt
