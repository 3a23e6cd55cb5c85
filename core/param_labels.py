"""The labels a model gives its parameters (`GPT.parameter_labels`) and the optimizers read (parameter groups,
roles): the one vocabulary both sides share, so that neither names a parameter kind the other does not know."""

# The token embedding (also the LM head when tied), an untied LM head, the learned position embedding, the value
# embeddings' tables (model.value_embeddings).
EMBEDDINGS = ("token_embedding", "head", "position", "value_embedding")
# The blocks' four linear weights, stored [L, in, *out] (qkv's out is [3, D]; SwiGLU's mlp_in is [2, F]): Muon's
# and Scion's hidden matrices, μP's width-scaled ones.
BLOCK_MATRICES = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")
MATRICES = (*EMBEDDINGS, *BLOCK_MATRICES)
# Norm weights (QK-norm's too), every bias, and the speedrun's learned scalars (the U-net skips' weights, the value
# embeddings' gates).
VECTORS = ("norm", "bias", "scalar")
LABELS = (*MATRICES, *VECTORS)
