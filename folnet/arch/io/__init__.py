"""Model directories in and out: folnet's own format (`model_dir`: ``config.json`` +
``model.safetensors``) and the checkpoints released with the paper (`official`)."""
