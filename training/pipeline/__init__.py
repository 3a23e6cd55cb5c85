"""The pipeline's parts, built in order from a finished config: the init_* functions (tokenizer, data, model,
schedule, optimizer), the train state on the mesh and the compiled steps (build.py). train_jax.py and the scripts
start here. Imports config/, distributed/, step/ and evaluation/ (and data/, models/, optimizers/)."""
