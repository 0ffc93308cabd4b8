"""Framework adapters: what differs between a PaddleNLP and a Hugging Face transformers checkpoint."""
