"""The model architectures (``llama.py``: the Llama family), their configuration and the
compiled decoder layers; building one from a folder is ``runtime/model_loader/load_model.py``."""
