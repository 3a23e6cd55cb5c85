"""The field's optimizers that no maintained JAX library has here (mars, adam_mini, scion, soap, kron): each one's
steps against its paper's rule written out again here, in float64 numpy, on the real tiny GPT's parameters with fixed
random gradients; Adam-mini's blocks; SOAP's first step as Adam in the eigenbases of G G^T and G^T G; each steps a
parameter group's part of the model by the same rule; each preset composes."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core.errors import ConfigError
from models.config import GPTConfig
from models.gpt import GPT
from optimizers import OPTIMIZERS, build_optimizer, build_schedule, lr_schedule_of, matrices
from optimizers.decay import fixed
from training.config import load_config

CFG = GPTConfig(vocab_size=16, n_layer=2, n_head=2, n_embd=8, context_size=8)
MODEL = GPT.init(CFG, jax.random.PRNGKey(0))
PARAMS = eqx.filter(MODEL, eqx.is_array)
D, HEAD = CFG.n_embd, CFG.n_embd // CFG.n_head
LR = 0.01  # the lr the tests step the parameters with (weight decay and the constrained Scion read them)
BLOCK_WEIGHTS = ("blocks.qkv.weight", "blocks.attn_proj.weight", "blocks.fc.weight", "blocks.mlp_proj.weight")
MATRICES = ("wte", "wpe") + BLOCK_WEIGHTS  # the reference codes' 2-D tensors
DECAYED = ("wte",) + BLOCK_WEIGHTS  # the project's weight-decay mask


def flat(tree) -> dict[str, np.ndarray]:
    """{"blocks.fc.weight": float64 array, ...}"""
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): np.asarray(x, np.float64)
        for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def unflat(arrays: dict[str, np.ndarray], like=PARAMS):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.asarray(arrays[jax.tree_util.keystr(path, simple=True, separator=".")], x.dtype), like
    )


def gradients(steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Fixed random gradients: the padded vocabulary rows get none (as in training) and the second layer's are 20x
    smaller than the first's (so MARS clips some layers and not others)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        g = {name: 0.1 * rng.standard_normal(x.shape) for name, x in flat(PARAMS).items()}
        g["wte"][CFG.vocab_size :] = 0.0
        for name in g:
            if name.startswith("blocks."):
                g[name][1] *= 0.05
        out.append(g)
    return out


def directions(
    opt: str | optax.GradientTransformation, grads: list[dict[str, np.ndarray]], params=PARAMS, **hyper
) -> list[dict[str, np.ndarray]]:
    """The optimizer's direction at each step (a registered one built with `hyper`), the parameters (`params`, in
    their dtype) moving by LR x it."""
    opt = OPTIMIZERS[opt](MODEL, **hyper) if isinstance(opt, str) else opt
    update = jax.jit(opt.update)
    state, out = opt.init(params), []
    for g in grads:
        u, state = update(unflat(g, params), state, params)
        params = optax.apply_updates(params, jax.tree.map(lambda x: LR * x, u))
        out.append(flat(u))
    return out


def assert_steps_match(got, expected, rtol=1e-4, atol=1e-6):
    """Elementwise, for float32 optimizers against their float64 numpy reference: elementwise rules (moments,
    clipping, sign, norms) round a few times per step, ~1e-6 relative; rtol 1e-4 leaves a wide margin, atol 1e-6
    covers entries near 0. Rules through matrix decompositions compare in scale (assert_steps_match_in_scale)."""
    for t, (step_got, step_expected) in enumerate(zip(got, expected, strict=True)):
        for name in step_expected:
            np.testing.assert_allclose(
                step_got[name], step_expected[name], rtol=rtol, atol=atol, err_msg=f"step {t + 1}, {name}"
            )


# ------------------------------------------------------------------------------------------------------------ MARS


def mars_reference(grads, gamma, beta1, beta2, eps, weight_decay, vectors=None):
    """MARS-AdamW, approximate (arXiv:2411.10438; AGI-Arena/MARS mars.py): the corrected gradient,
    clipped to norm 1 per layer's tensor, in AdamW. `vectors` (beta1, beta2, lr ratio): the reference's
    optimize_1d=False, AdamW with these for the 1-D tensors (LayerNorm, biases)."""
    x = flat(PARAMS)
    previous = {n: np.zeros_like(v) for n, v in x.items()}
    m = {n: np.zeros_like(v) for n, v in x.items()}
    v = {n: np.zeros_like(a) for n, a in x.items()}
    out, norms = [], []
    for t, g in enumerate(grads, start=1):
        d = {}
        for n in x:
            corrected = vectors is None or n in MATRICES
            b1, b2, ratio = (beta1, beta2, 1.0) if corrected else vectors
            c = g[n].copy()
            if corrected:  # MARS: the corrected gradient, clipped
                c = g[n] + gamma * beta1 / (1 - beta1) * (g[n] - previous[n])
                for tensor in [c[layer] for layer in range(c.shape[0])] if n.startswith("blocks.") else [c]:
                    norm = np.linalg.norm(tensor)
                    norms.append(norm)
                    if norm > 1:
                        tensor /= norm  # a view of c
                previous[n] = g[n]
            m[n] = b1 * m[n] + (1 - b1) * c
            v[n] = b2 * v[n] + (1 - b2) * c * c
            step = (m[n] / (1 - b1**t)) / (np.sqrt(v[n] / (1 - b2**t)) + eps)
            if n in DECAYED:
                step = step + weight_decay * x[n]
            d[n] = -ratio * step
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out, np.array(norms)


def test_mars_steps_follow_the_paper():
    hyper = dict(gamma=0.025, beta1=0.95, beta2=0.99, eps=1e-8, weight_decay=0.1)
    grads = gradients(3)
    expected, norms = mars_reference(grads, **hyper)
    assert (norms > 1).any() and (norms < 1).any()  # both sides of the clipping are exercised
    assert_steps_match(directions("mars", grads, **hyper), expected)


def test_mars_preset_gives_the_vectors_to_adamw_as_the_paper_code_does():
    """The preset's group: LayerNorm and biases to AdamW, betas (0.9, 0.95), at half the lr (optimize_1d=False)."""
    cfg = load_config(
        [
            "optimizer=mars",
            "optimizer.grad_clip=0",
            "optimizer/lr_config=constant",
            "optimizer.lr_config.lr=1.0",
            "optimizer.lr_config.warmup=0",
        ],
        num_local_devices=1,
    ).optimizer
    grads = gradients(3)
    got = directions(build_optimizer(cfg, build_schedule(cfg.lr_config, 10), MODEL, 1), grads)
    expected, _ = mars_reference(
        grads, cfg.gamma, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, vectors=(0.9, 0.95, 0.5)
    )
    assert_steps_match(got, expected)


# ------------------------------------------------------------------------------------------------------- Adam-mini


def adam_mini_block(name: str, index: tuple[int, ...]):
    """The block an entry belongs to (Adam-mini v1.1's partition, arXiv:2406.16793 / zyushun/Adam-mini)."""
    if name.endswith("bias"):
        return index  # every entry its own (Adam)
    if name == "wte":
        return index[0]  # one per token
    if name == "blocks.qkv.weight":
        layer, _, which, out = index
        return (layer, which, out // HEAD) if which < 2 else (layer, which, out)  # q, k per head; v per neuron
    if name in ("blocks.attn_proj.weight", "blocks.fc.weight", "blocks.mlp_proj.weight"):
        return index[0], index[-1]  # per layer, per output neuron
    if name.startswith("blocks."):
        return index[0]  # a LayerNorm weight, per layer
    return ()  # wpe, ln_f.weight: the whole tensor


def block_means(name: str, g: np.ndarray) -> dict:
    """Each block's mean of g^2."""
    sums, counts = {}, {}
    for index in np.ndindex(g.shape):
        b = adam_mini_block(name, index)
        sums[b] = sums.get(b, 0.0) + g[index] ** 2
        counts[b] = counts.get(b, 0) + 1
    return {b: sums[b] / counts[b] for b in sums}


def adam_mini_reference(grads, beta1, beta2, eps, weight_decay):
    x = flat(PARAMS)
    m = {n: np.zeros_like(a) for n, a in x.items()}
    v = {n: {} for n in x}
    out = []
    for t, g in enumerate(grads, start=1):
        d = {}
        for n in x:
            m[n] = beta1 * m[n] + (1 - beta1) * g[n]
            for b, mean in block_means(n, g[n]).items():
                v[n][b] = beta2 * v[n].get(b, 0.0) + (1 - beta2) * mean
            v_entry = np.empty_like(g[n])
            for index in np.ndindex(g[n].shape):
                v_entry[index] = v[n][adam_mini_block(n, index)]
            step = (m[n] / (1 - beta1**t)) / (np.sqrt(v_entry / (1 - beta2**t)) + eps)
            d[n] = -(step + (weight_decay * x[n] if n in DECAYED else 0.0))
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out


def test_adam_mini_steps_follow_the_paper():
    hyper = dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    grads = gradients(3)
    assert_steps_match(directions("adam_mini", grads, **hyper), adam_mini_reference(grads, **hyper))


def test_adam_mini_keeps_one_second_moment_per_block():
    beta2 = 0.95
    opt = OPTIMIZERS["adam_mini"](MODEL, beta1=0.9, beta2=beta2, eps=1e-8, weight_decay=0.0)
    g = gradients(1)[0]
    _, state = jax.jit(opt.update)(unflat(g), opt.init(PARAMS), PARAMS)
    kept = flat(
        jax.tree.map(lambda _, nu: jnp.concatenate([jnp.ravel(a) for a in jax.tree.leaves(nu)]), PARAMS, state[0].nu)
    )
    sizes = {n: a.size for n, a in flat(PARAMS).items()}
    for n, values in kept.items():
        means = block_means(n, g[n])
        assert values.size == len(means), n  # one value per block, no more
        # one float32 mean of squares per block against float64: a sum's rounding, ~1e-7 relative; all values > 0
        np.testing.assert_allclose(
            np.sort(values), np.sort((1 - beta2) * np.array(list(means.values()))), rtol=1e-5, atol=1e-12, err_msg=n
        )
    assert kept["blocks.qkv.weight"].size == CFG.n_layer * (2 * CFG.n_head + D)
    assert kept["wte"].size == CFG.padded_vocab_size and kept["wpe"].size == 1
    assert sum(a.size for a in kept.values()) < sum(sizes.values()) / 3


# ------------------------------------------------------------------------------------------------------------ Scion


def newton_schulz(x: np.ndarray) -> np.ndarray:
    """The paper code's zeropower_via_newtonschulz5 (5 quintic steps from x / ||x||_F), in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    wide = x.T if x.shape[0] > x.shape[1] else x
    y = wide / (np.linalg.norm(wide) + 1e-8)
    for _ in range(5):
        gram = y @ y.T
        y = a * y + (b * gram + c * gram @ gram) @ y
    return y.T if x.shape[0] > x.shape[1] else y


def rms_rows(d: np.ndarray) -> np.ndarray:
    return d / (np.sqrt(np.mean(d * d, axis=-1, keepdims=True)) + 1e-8)


def scion_reference(grads, momentum, scale_hidden, scale_embed, scale_input, scale_vector, unconstrained):
    """Scion (arXiv:2502.07529, LIONS-EPFL/scion): d <- momentum d + (1 - momentum) g;
    w <- (1 - lr) w - lr rho lmo(d)."""
    x = flat(PARAMS)
    avg = {n: np.zeros_like(a) for n, a in x.items()}
    out = []
    for g in grads:
        d = {}
        for n in x:
            avg[n] = momentum * avg[n] + (1 - momentum) * g[n]
            a = avg[n]
            if n in BLOCK_WEIGHTS:  # spectral: U V^T x sqrt(d_out / d_in), per layer; q, k, v each on its own
                lmo = np.zeros_like(a)
                for layer in range(CFG.n_layer):
                    if n == "blocks.qkv.weight":
                        for which in range(3):
                            lmo[layer, :, which] = scale_hidden * newton_schulz(a[layer, :, which])
                    else:
                        d_in, d_out = a[layer].shape
                        lmo[layer] = scale_hidden * np.sqrt(d_out / d_in) * newton_schulz(a[layer])
            elif n == "wte":  # tied to the head: the output layer's sign / d_in
                lmo = scale_embed * np.sign(a) / D
            elif n == "wpe":  # one-hot input: each position's row by its RMS
                lmo = scale_input * rms_rows(a)
            else:  # vectors: by their RMS, per layer (qkv's bias per q, k, v)
                lmo = scale_vector * rms_rows(a)
            d[n] = -(lmo if unconstrained else lmo + x[n])
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out


@pytest.mark.parametrize("unconstrained", [False, True])
def test_scion_steps_follow_the_paper(unconstrained):
    hyper = dict(
        momentum=0.9, scale_hidden=3.0, scale_embed=40.0, scale_input=0.5, scale_vector=2.0, unconstrained=unconstrained
    )
    grads = gradients(3)
    # Newton-Schulz in float32 (5 matmul iterations) against float64: looser than the elementwise rules
    assert_steps_match(directions("scion", grads, **hyper), scion_reference(grads, **hyper), rtol=2e-4, atol=2e-5)


# ------------------------------------------------------------------------------------------------------------- SOAP


class ReferenceSoapMatrix:
    """One [m, n] matrix as the paper's soap.py keeps it: exp_avg in the current eigenbasis (rotated back and forth
    around each preconditioner update), exp_avg_sq there, L and R (GG) and their eigenbases Q."""

    def __init__(self, m, n, max_precond_dim):
        self.gg = [np.zeros((k, k)) if k <= max_precond_dim else None for k in (m, n)]
        self.q = None
        self.exp_avg, self.exp_avg_sq, self.step = np.zeros((m, n)), np.zeros((m, n)), 0

    def project(self, x):
        left, right = self.q
        x = x if left is None else left.T @ x
        return x if right is None else x @ right

    def project_back(self, x):
        left, right = self.q
        x = x if left is None else left @ x
        return x if right is None else x @ right.T

    def update_preconditioner(self, g, shampoo_beta, frequency):
        if self.q is not None:
            self.exp_avg = self.project_back(self.exp_avg)
        grams = (g @ g.T, g.T @ g)
        self.gg = [
            None if gg is None else shampoo_beta * gg + (1 - shampoo_beta) * gram for gg, gram in zip(self.gg, grams)
        ]
        if self.q is None:  # eigh, largest eigenvalue first
            self.q = [None if gg is None else np.linalg.eigh(gg)[1][:, ::-1] for gg in self.gg]
        if self.step > 0 and self.step % frequency == 0:  # one power iteration + QR, sorted by estimated eigenvalue
            new_q = []
            for axis, (gg, q) in enumerate(zip(self.gg, self.q)):
                if gg is None:
                    new_q.append(None)
                    continue
                order = np.argsort(-np.diag(q.T @ gg @ q), kind="stable")
                self.exp_avg_sq = np.take(self.exp_avg_sq, order, axis=axis)
                new_q.append(np.linalg.qr(gg @ q[:, order])[0])
            self.q = new_q
        if self.step > 0:
            self.exp_avg = self.project(self.exp_avg)

    def direction(self, g, beta1, beta2, eps, shampoo_beta, frequency):
        if self.q is None:  # the first step only builds the preconditioner
            self.update_preconditioner(g, shampoo_beta, frequency)
            return np.zeros_like(g)
        g_rot = self.project(g)
        self.step += 1
        self.exp_avg = beta1 * self.exp_avg + (1 - beta1) * g_rot
        self.exp_avg_sq = beta2 * self.exp_avg_sq + (1 - beta2) * g_rot**2
        step_size = np.sqrt(1 - beta2**self.step) / (1 - beta1**self.step)
        n = step_size * self.project_back(self.exp_avg / (np.sqrt(self.exp_avg_sq) + eps))
        self.update_preconditioner(g, shampoo_beta, frequency)
        return n


def soap_reference(grads, beta1, beta2, eps, weight_decay, precondition_frequency, max_precond_dim, shampoo_beta):
    """SOAP (arXiv:2409.11321, nikhilvyas/SOAP soap.py), per layer's matrix (qkv as [D, 3D]); vectors: the same Adam
    with no preconditioner. Weight decay from the step's starting weights, as the pipeline decays."""
    s = beta2 if shampoo_beta < 0 else shampoo_beta
    x = flat(PARAMS)

    def matrices(n, a):
        """Each layer's [in, out] (a vector as a column)."""
        layers = [a[layer] for layer in range(a.shape[0])] if n.startswith("blocks.") else [a]
        return [w.reshape(w.shape[0], -1) for w in layers]

    def shape_as(n, pieces):
        return np.stack(pieces).reshape(x[n].shape)

    ref = {
        n: [ReferenceSoapMatrix(*mat.shape, max_precond_dim if n in MATRICES else 0) for mat in matrices(n, x[n])]
        for n in x
    }
    out = []
    for g in grads:
        d = {}
        for n in x:
            pieces = [
                r.direction(mat, beta1, beta2, eps, s, precondition_frequency)
                for r, mat in zip(ref[n], matrices(n, g[n]))
            ]
            first = ref[n][0].step == 0
            d[n] = -(shape_as(n, pieces) + (weight_decay * x[n] if n in DECAYED and not first else 0.0))
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out


SOAP_HYPER = dict(
    beta1=0.95, beta2=0.9, eps=1e-8, weight_decay=0.1, precondition_frequency=2, max_precond_dim=D, shampoo_beta=0.8
)


@pytest.mark.parametrize("batched", [False, True], ids=["one_matrix_per_call", "batched"])
def test_soap_steps_follow_the_paper(batched, monkeypatch):
    """The rule, in the reference's own precision: SOAP on float64 parameters computes in float64 (optimizers/soap.py's
    `wide`), against the paper's algorithm in float64 numpy, to 1e-9 of each tensor's scale. Both ways of running
    the decompositions: one matrix per call (CPU) and the batch in one call (GPU, TPU). max_precond_dim 8 = n_embd:
    every preconditioner kept has full rank, so its eigenbasis is unique (up to signs, which SOAP's update does not
    see); the longer sides (vocabulary, 3D, 4D) get none, as a side over the limit. (In float32 the eigenvectors of
    these grams carry errors of about u ||A|| / gap, u = 6e-8 and ||A|| / gap up to 151 here: a float32 run differs
    from float64 by ~1e-5 of a tensor's scale, by how much depending on the CPU; the next test bounds that.)"""
    monkeypatch.setattr(matrices, "batched_decompositions", lambda: batched)
    grads = gradients(4)  # the first only builds L and R, the third step refreshes the bases, the fourth uses them
    with jax.enable_x64(True):
        got = directions(
            "soap", grads, params=jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), PARAMS), **SOAP_HYPER
        )
    assert all(np.all(u == 0) for u in got[0].values())
    assert_steps_match_in_scale(got, soap_reference(grads, **SOAP_HYPER), 1e-9)


def test_soap_in_float32_stays_within_float32s_error_of_the_paper():
    """What training runs: float32. Each tensor's direction within 1e-3 of its scale of the float64 reference: the
    eigenvectors of a float32 gram A of an [m, n] gradient are off by up to ~n u ||A|| / gap (n <= 32, u = 6e-8,
    ||A|| / gap <= 151 for these gradients: 3e-4), and the rotations add a few u more. Measured: 2e-5 on an Intel
    Xeon (AVX-512) and with XLA limited to AVX2. A wrong rule (a basis not refreshed, momentum not rotated) is off by
    far more than 1e-3 of the scale."""
    grads = gradients(4)
    assert_steps_match_in_scale(directions("soap", grads, **SOAP_HYPER), soap_reference(grads, **SOAP_HYPER), 1e-3)


def assert_steps_match_in_scale(got, expected, tolerance):
    """Each tensor's largest difference at most `tolerance` x its largest entry (an eigenbasis' error is spread over
    the whole tensor, so a small entry's relative error says nothing)."""
    for t, (step_got, step_expected) in enumerate(zip(got, expected, strict=True)):
        for name, want in step_expected.items():
            scale = np.abs(want).max()
            error = np.abs(step_got[name] - want).max()
            assert error <= tolerance * scale, (
                f"step {t + 1}, {name}: off by {error:.3g}, {error / scale:.3g} of its scale"
            )


def test_soap_first_step_is_adam_rotated_into_the_eigenbases_of_the_first_gradient():
    """In float64 (as the paper test: the eigenvectors exact to ~1e-14, so 1e-9 of the scale is a wide margin)."""
    beta1, beta2, eps = 0.9, 0.99, 1e-8
    opt = OPTIMIZERS["soap"](
        MODEL,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=0.0,
        precondition_frequency=1,
        max_precond_dim=D,
        shampoo_beta=-1.0,
    )
    g1, g2 = gradients(2, seed=1)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), PARAMS)
        update = jax.jit(opt.update)
        u1, state = update(unflat(g1, params), opt.init(params), params)
        u2, _ = update(unflat(g2, params), state, params)
    assert all(np.all(u == 0) for u in flat(u1).values())  # the paper's code: the first gradient only builds L, R
    for layer in range(CFG.n_layer):
        G1, G2 = g1["blocks.attn_proj.weight"][layer], g2["blocks.attn_proj.weight"][layer]
        q_left, q_right = np.linalg.eigh(G1 @ G1.T)[1], np.linalg.eigh(G1.T @ G1)[1]
        rotated = q_left.T @ G2 @ q_right
        # Adam's first step (bias-corrected, eps added before the correction, as the paper's code) in that basis
        adam = np.sqrt(1 - beta2) / (1 - beta1) * ((1 - beta1) * rotated) / (np.sqrt((1 - beta2) * rotated**2) + eps)
        assert_steps_match_in_scale(
            [{"w": flat(u2)["blocks.attn_proj.weight"][layer]}], [{"w": -(q_left @ adam @ q_right.T)}], 1e-9
        )


# ------------------------------------------------------------------------------------------------ all four: groups

HYPER = {
    "kron": dict(beta1=0.9, weight_decay=0.1, precond_lr=0.1, precond_update_probability=1.0, max_size_triangular=D),
    "mars": dict(gamma=0.025, beta1=0.95, beta2=0.99, eps=1e-8, weight_decay=0.1),
    "adam_mini": dict(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1),
    "scion": dict(
        momentum=0.9, scale_hidden=3.0, scale_embed=40.0, scale_input=0.5, scale_vector=2.0, unconstrained=False
    ),
    "soap": dict(
        beta1=0.95,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        precondition_frequency=1,
        max_precond_dim=D,
        shampoo_beta=-1.0,
    ),
}
REFERENCE = {
    "mars": lambda g, **h: mars_reference(g, **h)[0],
    "adam_mini": adam_mini_reference,
    "scion": scion_reference,
    "soap": soap_reference,
    # Kron's rule is checked on the whole model below; given a group, it must step the group's tensors as it
    # steps them given the whole model (its draws go by each parameter's path)
    "kron": lambda g, **h: directions("kron", g, **h),
}


@pytest.mark.parametrize("name", sorted(HYPER))
def test_a_parameter_group_steps_as_the_paper_says(name):
    """Given part of the model (optax.partition, as optimizer.groups builds it), each of its tensors steps by the
    paper's rule, the others not at all: the rules go by each tensor's role, not by its place in a full tree."""
    mine = ("attn_qkv", "mlp_out", "token_embedding", "norm", "bias")
    labels = jax.tree.map(lambda label: "mine" if label in mine else "other", MODEL.parameter_labels())
    part = optax.partition(
        {"mine": OPTIMIZERS[name](MODEL, **HYPER[name]), "other": optax.set_to_zero()}, fixed(labels)
    )
    grads = gradients(3)
    got, expected = directions(part, grads), REFERENCE[name](grads, **HYPER[name])
    is_mine = flat(jax.tree.map(lambda label: label == "mine", labels))
    expected = [{n: u if is_mine[n] else 0.0 * u for n, u in step.items()} for step in expected]
    if name == "soap":  # float32 eigenvectors against float64: within float32's bound, in scale (see the SOAP tests)
        assert_steps_match_in_scale(got, expected, 1e-3)
    else:  # Newton-Schulz, Kron's triangular factors: float32 matmul chains, a few 1e-6 per step; 2e-4 / 2e-5 margin
        assert_steps_match(got, expected, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", ["mars", "adam_mini", "scion", "soap", "kron"])
def test_the_preset_composes_and_builds(name):
    cfg = load_config([f"optimizer={name}"], num_local_devices=1)
    assert cfg.optimizer.name == name
    opt = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 100), MODEL, 1)
    jax.eval_shape(opt.init, PARAMS)


def test_soap_reports_its_preconditioners_condition_estimate():
    """optimizer/soap_condition: the largest ratio of a preconditioner's eigenvalues on its range, largest over
    smallest, against numpy's eigenvalues of the same moving averages (the first call's bases are exact: eigh)."""
    from optimizers.reporting import optimizer_metrics
    from optimizers.soap import SoapState

    model = GPT.init(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_size=8), jax.random.PRNGKey(0))
    cfg = load_config(["optimizer=soap", "optimizer.precondition_frequency=1", "optimizer.grad_clip=0"])
    optimizer = build_optimizer(cfg.optimizer, build_schedule(cfg.optimizer.lr_config, 10), model, 1)
    params = eqx.filter(model, eqx.is_array)
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(1), x.shape), params)
    _, state = jax.jit(lambda g, p: optimizer.update(g, optimizer.init(p), p))(grads, params)
    (soap,) = [
        s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, SoapState)) if isinstance(s, SoapState)
    ]
    want = 0.0
    for gg in jax.tree.leaves((soap.gg_left, soap.gg_right)):
        for matrix in np.asarray(gg, np.float64):
            eigen = np.linalg.eigvalsh(matrix)
            on_range = eigen[eigen > 1e-6 * eigen.max()]
            want = max(want, eigen.max() / on_range.min())
    got = float(optimizer_metrics(state)["optimizer/soap_condition"])
    # a ratio of float32 eigenvalue estimates (the smallest on the range ~1e-6 of the largest is known to ~1e-3)
    assert want > 1 and got == pytest.approx(want, rel=1e-2), (got, want)


# ------------------------------------------------------------------------------------------------------------- Kron


def norm_lower_bound(a):
    """psgd-jax's spectral-norm estimate of a symmetric matrix: one power step from its largest row."""
    top = np.abs(a).max()
    a = a / top
    x = a[np.argmax(np.sum(a * a, axis=1))] @ a
    return top * np.linalg.norm((x / np.linalg.norm(x)) @ a)


def kron_reference(
    grads,
    step_draws,
    beta1,
    weight_decay,
    precond_lr,
    precond_update_probability,
    max_size_triangular,
    momentum_into_precond=True,
):
    """PSGD Kron (Li, arXiv:1512.04202 and 2402.11858; psgd-jax's kron) per layer's matrix [in, out] (a vector as a
    row [1, n]), in float64, the preconditioner's factors as full matrices (a diagonal factor as a diagonal matrix,
    refit by its own rule). `step_draws`: each step's refit draw, probes V and noise Z by parameter name."""
    x = flat(PARAMS)

    def matrices(n, a):
        layers = [a[layer] for layer in range(a.shape[0])] if n.startswith("blocks.") else [a]
        return [w.reshape(w.shape[0], -1) if n in MATRICES else w.reshape(1, -1) for w in layers]

    def kind(n, size):
        return None if size == 1 else ("tri" if n in MATRICES and size <= max_size_triangular else "diag")

    q = {n: [[np.eye(k) for k in mat.shape] for mat in matrices(n, x[n])] for n in x}
    mu = {n: np.zeros_like(a) for n, a in x.items()}
    out = []
    for t, (g, (u, probes, noise)) in enumerate(zip(grads, step_draws), start=1):
        d = {}
        for n in x:
            mu[n] = beta1 * mu[n] + (1 - beta1) * g[n]
            fitted = matrices(n, mu[n] / (1 - beta1**t) if momentum_into_precond else g[n])
            pieces = []
            for b, (h, (ql, qr)) in enumerate(zip(fitted, q[n])):
                kinds = (kind(n, h.shape[0]), kind(n, h.shape[1]))
                if t == 1:  # P starts at (mean h^4)^(-1/4): Q's scale split over the sides present
                    c = np.mean(h**4) ** (-1 / 8)
                    c = c ** (1 / sum(k is not None for k in kinds))
                    ql, qr = (ql * c if kinds[0] else ql), (qr * c if kinds[1] else qr)
                if u < precond_update_probability:
                    v, z = np.asarray(probes[n][b], np.float64), np.asarray(noise[n][b], np.float64)
                    hd = h + np.sqrt(np.finfo(np.float32).eps) * np.mean(np.abs(h)) * z
                    a = ql @ hd @ qr.T
                    bb = np.linalg.inv(ql).T @ v @ np.linalg.inv(qr)
                    new = []
                    for _side, (qs, k, t1, t2) in enumerate(
                        ((ql, kinds[0], a @ a.T, bb @ bb.T), (qr, kinds[1], a.T @ a, bb.T @ bb))
                    ):
                        if k == "tri":
                            qs = qs - precond_lr / norm_lower_bound(t1 + t2) * np.triu(t1 - t2) @ qs
                        elif k == "diag":
                            ta, tb = np.diag(t1), np.diag(t2)
                            qs = np.diag(np.diag(qs) - precond_lr / np.abs(ta + tb).max() * (ta - tb) * np.diag(qs))
                        new.append(qs)
                    ql, qr = new
                    if all(kinds):  # the sides rebalanced: equal largest entries
                        nl, nr = np.abs(ql).max(), np.abs(qr).max()
                        ql, qr = ql * np.sqrt(nl * nr) / nl, qr * np.sqrt(nl * nr) / nr
                q[n][b] = [ql, qr]
                m_hat = matrices(n, mu[n] / (1 - beta1**t))[b]
                p = ql.T @ ql @ m_hat @ qr.T @ qr
                pieces.append(p * min(1.0, 1.1 / (np.sqrt(np.mean(p**2)) + 1e-12)))
            d[n] = -(np.stack(pieces).reshape(x[n].shape) + (weight_decay * x[n] if n in DECAYED else 0.0))
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out


@functools.cache
def kron_step_draws():
    """key -> the draws kron's step makes from its state's key for MODEL's parameters (one program for the module)."""
    from optimizers.kron import as_matrices, draws
    from optimizers.param_roles import roles_of

    roles = roles_of(MODEL)
    shapes = {n: as_matrices(p, roles[n]).shape for n, p in zip(flat(PARAMS), jax.tree.leaves(PARAMS))}
    return jax.jit(lambda key: draws(jax.random.split(key)[1], shapes))


@pytest.mark.parametrize("momentum_into_precond", [True, False])
def test_kron_steps_follow_the_paper(momentum_into_precond):
    """Five steps, refit with probability 1/2 (the draws land on both sides of it: steps that refit and steps that
    keep the preconditioner); wte's vocabulary side and qkv's 3D side over max_size_triangular get diagonal factors,
    the rest triangular, vectors a diagonal one. The draws are the rule's inputs, read from the optimizer's key.
    The refit probability is reported as optimizer/kron_refit_probability."""
    from optimizers.reporting import optimizer_metrics

    hyper = dict(
        beta1=0.9,
        weight_decay=0.1,
        precond_lr=0.1,
        precond_update_probability=0.5,
        max_size_triangular=D,
        momentum_into_precond=momentum_into_precond,
    )
    opt = OPTIMIZERS["kron"](MODEL, **hyper)
    update = jax.jit(opt.update)
    grads = gradients(5)
    params, state, got, step_draws = PARAMS, opt.init(PARAMS), [], []
    for g in grads:
        u, probes, noise = kron_step_draws()(state.key)
        step_draws.append((float(u), probes, noise))
        d, state = update(unflat(g), state, params)
        params = optax.apply_updates(params, jax.tree.map(lambda x: LR * x, d))
        got.append(flat(d))
    assert float(optimizer_metrics(state)["optimizer/kron_refit_probability"]) == 0.5
    refits = [u < 0.5 for u, _, _ in step_draws]
    assert any(refits[1:]) and not all(refits), refits  # both branches after the first step
    # float32 triangular factors and solves against float64: matmul chains, as for the groups test
    assert_steps_match(got, kron_reference(grads, step_draws, **hyper), rtol=2e-4, atol=2e-5)


def test_kron_draws_the_parameters_of_one_shape_together_and_each_gets_its_own_numbers():
    """The step draws the probes and noise of all parameters of one shape in one vmapped draw: each parameter still
    gets the numbers its path alone gives it (`leaf_draws`, one draw per parameter), whichever parameters share its
    shape (float rounding of the normal's erf-inverse aside: two programs), and no two parameters get the same."""
    from optimizers.kron import leaf_draws, leaf_draws_by_shape

    shapes = {"wte": (1, 259, 64), "a/weight": (2, 64, 64), "a/bias": (2, 1, 64), "b/bias": (2, 1, 64), "c": (2, 1, 64)}
    key = jax.random.PRNGKey(3)
    probes, noise = jax.jit(lambda k: leaf_draws_by_shape(k, shapes))(key)
    alone = jax.jit(lambda k: {n: leaf_draws(k, n, s) for n, s in shapes.items()})(key)
    for name, shape in shapes.items():
        assert probes[name].shape == noise[name].shape == shape
        np.testing.assert_allclose(probes[name], alone[name][0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(noise[name], alone[name][1], rtol=1e-6, atol=1e-6)
    shared = [probes["a/bias"], probes["b/bias"], probes["c"], noise["a/bias"], noise["b/bias"], noise["c"]]
    assert all(not np.allclose(x, y) for i, x in enumerate(shared) for y in shared[i + 1 :])


def test_kron_refits_with_psgds_decaying_probability():
    from optimizers.kron import update_probability

    p = [float(update_probability(jnp.asarray(t))) for t in (1, 500, 1500, 100_000)]
    assert p == pytest.approx([1.0, 1.0, np.exp(-1.0), 0.03], rel=1e-6)  # one float32 exp: ~1e-7


# ---------------------------------------------------------------------------------------------------------- Prodigy

LR_SCHEDULE = [0.25, 0.5, 0.75, 1.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]  # a warmup, then a decay (peak 1)


def on_the_quadratic(opt, x_star, lrs):
    """The step-size estimating optimizers on 0.5 |x - x*|^2, the lr handed to each update as the train step hands
    it: each step's movement (lr x the direction) and the estimate d after it."""
    update = jax.jit(opt.update)
    params, state, moves, ds = PARAMS, opt.init(PARAMS), [], []
    for lr in lrs:
        grads = jax.tree.map(lambda p, t: p - t, params, unflat(x_star))
        u, state = update(grads, state, params, lr=lr)
        move = jax.tree.map(lambda x: lr * x, u)
        params = optax.apply_updates(params, move)
        moves.append(flat(move))
        ds.append(float(state.d))
    return moves, ds


def prodigy_reference(x_star, lrs, beta1, beta2, eps, d0, d_coef, weight_decay, bias_correction, growth_rate=np.inf):
    """The authors' Prodigy (prodigyopt's step, one parameter group, decoupled decay, slice_p 1), written out in
    float64 numpy on the quadratic 0.5 |x - x*|^2 (gradient x - x*): each step's movement and d after it."""
    x = flat(PARAMS)
    x0 = {n: v.copy() for n, v in x.items()}
    m, v, s = ({n: np.zeros_like(a) for n, a in x.items()} for _ in range(3))
    d, d_max, numerator, beta3 = d0, d0, 0.0, np.sqrt(beta2)
    moves, ds = [], []
    for k, lr in enumerate(lrs):
        g = {n: x[n] - x_star[n] for n in x}
        c = np.sqrt(1 - beta2 ** (k + 1)) / (1 - beta1 ** (k + 1)) if bias_correction else 1.0
        dlr = d * lr * c
        numerator = beta3 * numerator + (d / d0) * dlr * sum(np.sum(g[n] * (x0[n] - x[n])) for n in x)
        denominator = 0.0
        for n in x:
            m[n] = beta1 * m[n] + d * (1 - beta1) * g[n]
            v[n] = beta2 * v[n] + d * d * (1 - beta2) * g[n] ** 2
            s[n] = beta3 * s[n] + (d / d0) * dlr * g[n]
            denominator += np.abs(s[n]).sum()
        d_hat = d_coef * numerator / denominator
        if d == d0:
            d = max(d, d_hat)
        d_max = max(d_max, d_hat)
        d = min(d_max, d * growth_rate)
        move = {}
        for n in x:
            move[n] = -dlr * m[n] / (np.sqrt(v[n]) + d * eps) - (dlr * weight_decay * x[n] if n in DECAYED else 0.0)
            x[n] = x[n] + move[n]
        moves.append(move)
        ds.append(d)
    return moves, ds


@pytest.mark.parametrize("bias_correction", [False, True])
def test_prodigy_steps_follow_the_reference(bias_correction):
    """12 steps on a quadratic with a scheduled lr that enters the estimate's sums (warmup, then decay), against the
    reference's rule in float64: each step's movement (lr x the direction) and the estimate d. Without the bias
    correction (the reference's default) d grows ~100x more in these steps than with it."""
    hyper = dict(beta1=0.9, beta2=0.999, eps=1e-8, d0=1e-6, d_coef=1.0, weight_decay=0.1)
    x_star = {n: a + 0.5 * np.random.default_rng(3).standard_normal(a.shape) for n, a in flat(PARAMS).items()}
    opt = OPTIMIZERS["prodigy"](MODEL, beta3=0.0, safeguard_warmup=False, bias_correction=bias_correction, **hyper)
    moves, ds = on_the_quadratic(opt, x_star, LR_SCHEDULE)
    want_moves, want_ds = prodigy_reference(x_star, LR_SCHEDULE, bias_correction=bias_correction, **hyper)
    # float32 parameters against float64: the first moves (~1e-8) are a few ulp of a 0.02 weight (2e-9), so x0 - x,
    # which the estimate sums, is off by ~1e-1 per entry at first and ~2e-4 in the sum: rtol 1e-3
    np.testing.assert_allclose(ds, want_ds, rtol=1e-3)
    assert_steps_match(moves, want_moves, rtol=1e-3, atol=1e-9)
    assert ds[-1] > (3.0 if bias_correction else 300.0) * hyper["d0"], ds  # the estimate grew


def test_prodigy_without_bias_correction_grows_its_estimate_far_faster():
    """The reason the preset follows the reference (no bias correction): after 12 steps of the quadratic at lr 1,
    d is ~100x larger than with Adam's correction, which optax.contrib.prodigy always applies."""
    x_star = {n: a + 0.5 * np.random.default_rng(3).standard_normal(a.shape) for n, a in flat(PARAMS).items()}
    hyper = dict(beta1=0.9, beta2=0.999, eps=1e-8, d0=1e-6, d_coef=1.0, weight_decay=0.0)
    plain, corrected = (prodigy_reference(x_star, [1.0] * 12, bias_correction=b, **hyper)[1][-1] for b in (False, True))
    assert plain > 30 * corrected, (plain, corrected)


# ----------------------------------------------------------------------------------------------------- D-Adaptation


def dadapt_reference(x_star, lrs, beta1, beta2, eps, d0, weight_decay, growth_rate=np.inf):
    """The authors' DAdaptAdam step (dadaptation, one parameter group, decouple=True, use_bias_correction=False), in
    float64 numpy on the quadratic 0.5 |x - x*|^2: each step's movement and d after it."""
    x = flat(PARAMS)
    m, v, s = ({n: np.zeros_like(a) for n, a in x.items()} for _ in range(3))
    d, numerator, b = d0, 0.0, np.sqrt(beta2)
    moves, ds = [], []
    for lr in lrs:
        g = {n: x[n] - x_star[n] for n in x}
        dlr = d * lr
        along = sum(np.sum(g[n] * s[n] / (np.sqrt(v[n]) + eps)) for n in x)  # s and v from before this step
        s_l1 = 0.0
        for n in x:
            m[n] = beta1 * m[n] + dlr * (1 - beta1) * g[n]
            v[n] = beta2 * v[n] + (1 - beta2) * g[n] ** 2
            s[n] = b * s[n] + dlr * (1 - b) * g[n]
            s_l1 += np.abs(s[n]).sum()
        numerator = b * numerator + (1 - b) * dlr * along
        d = max(d, min(numerator / ((1 - b) * s_l1), d * growth_rate))
        move = {n: -m[n] / (np.sqrt(v[n]) + eps) - (dlr * weight_decay * x[n] if n in DECAYED else 0.0) for n in x}
        for n in x:
            x[n] = x[n] + move[n]
        moves.append(move)
        ds.append(d)
    return moves, ds


def test_dadapt_adamw_steps_follow_the_reference():
    """12 steps on a quadratic with a scheduled lr (inside the reference's momentum), against its rule in float64."""
    hyper = dict(beta1=0.9, beta2=0.999, eps=1e-8, d0=1e-6, weight_decay=0.1)
    x_star = {n: a + 0.5 * np.random.default_rng(3).standard_normal(a.shape) for n, a in flat(PARAMS).items()}
    moves, ds = on_the_quadratic(OPTIMIZERS["dadapt_adamw"](MODEL, **hyper), x_star, LR_SCHEDULE)
    want_moves, want_ds = dadapt_reference(x_star, LR_SCHEDULE, **hyper)
    # float32 against float64: the estimate is a difference of two sums ((s^2/a)/(1 - b2) - r), ~1e-4 apart in
    # float32; the moves (up to ~0.4 once d has grown) in scale: each side's gradient comes from its own params, so
    # float32's rounding (~1e-7 of the scale) compounds over the 12 steps: 1e-4
    np.testing.assert_allclose(ds, want_ds, rtol=1e-3)
    assert_steps_match_in_scale(moves, want_moves, 1e-4)
    assert ds[-1] > 100 * hyper["d0"], ds  # the estimate grew


@pytest.mark.parametrize("name", ["prodigy", "dadapt_adamw"])
def test_the_runs_lr_is_the_references_lr_for_the_estimating_methods(name):
    """optimizer.lr_config.lr multiplies the estimated step size, as the reference's lr: the pipeline's optimizer at a
    constant lr 0.5 (its lr handed to each update as the train step hands it) moves as the reference at lr 0.5, which
    is not how it moves at lr 1 (its estimate weighs each step by the lr, so neither moves nor d simply halve)."""
    overrides = [f"optimizer={name}", "optimizer/lr_config=constant", "optimizer.lr_config.warmup=0"]
    cfg = load_config([*overrides, "optimizer.lr_config.lr=0.5", "optimizer.grad_clip=0"]).optimizer
    schedule = build_schedule(cfg.lr_config, 10)
    opt, lr = build_optimizer(cfg, schedule, MODEL, 1), lr_schedule_of(cfg, schedule)
    x_star = {n: a + 0.5 * np.random.default_rng(3).standard_normal(a.shape) for n, a in flat(PARAMS).items()}
    update, params, state, moves = jax.jit(opt.update), PARAMS, opt.init(PARAMS), []
    for k in range(6):
        u, state = update(jax.tree.map(lambda p, t: p - t, params, unflat(x_star)), state, params, lr=lr(k))
        params = optax.apply_updates(params, u)
        moves.append(flat(u))
    hyper = dict(beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps, d0=cfg.d0, weight_decay=cfg.weight_decay)
    reference = functools.partial(prodigy_reference, d_coef=1.0, bias_correction=False) if name == "prodigy" else None
    reference = reference or dadapt_reference
    assert_steps_match_in_scale(moves, reference(x_star, [0.5] * 6, **hyper)[0], 1e-3)
    at_1 = reference(x_star, [1.0] * 6, **hyper)[0][-1]
    assert max(np.abs(moves[-1][n] - at_1[n]).max() / np.abs(at_1[n]).max() for n in at_1) > 0.1


# ------------------------------------------------------------------------------------------------------------- Muon


def nesterov_look(m, g, beta, t):
    """optax's Muon momentum at step t (from 1): m <- beta m + (1 - beta) g, then the bias-corrected Nesterov
    look-ahead; returns both."""
    m = beta * m + (1 - beta) * g
    return m, beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)


def orthogonalised(look: np.ndarray, orthogonalise=None) -> np.ndarray:
    """Each layer's matrix of a stacked [L, in, *out] tensor orthogonalised (Newton-Schulz unless `orthogonalise`) as
    [in, out] and scaled by sqrt(max(1, out / in)), optax's width scaling."""
    orthogonalise = orthogonalise or newton_schulz
    layers = []
    for layer in range(look.shape[0]):
        a = look[layer].reshape(look.shape[1], -1)  # [in, out]
        layers.append((np.sqrt(max(1.0, a.shape[1] / a.shape[0])) * orthogonalise(a)).reshape(look.shape[1:]))
    return np.stack(layers)


def muon_reference(grads, momentum, weight_decay):
    """Muon as the pipeline runs it (optax.contrib.muon, float64 numpy), on each layer's block matrix [in, out]: an EMA
    of the gradient with Nesterov's look-ahead, both bias-corrected (m = b m + (1 - b) g; b m / (1 - b^(t+1)) +
    (1 - b) g / (1 - b^t)), orthogonalised by 5 quintic Newton-Schulz steps (3.4445, -4.7750, 2.0315) from X / ||X||_F
    (on the wide side), scaled by sqrt(max(1, out / in)), plus decoupled decay from the step's starting weights.
    Keller Jordan's reference keeps a plain momentum sum instead (measured: cosine > 0.995 to this from step 2, the
    same direction at step 1); the rest is the same rule."""
    x = flat(PARAMS)
    m = {n: np.zeros_like(x[n]) for n in BLOCK_WEIGHTS}
    out = []
    for t, g in enumerate(grads, start=1):
        d = {}
        for n in BLOCK_WEIGHTS:
            m[n], look = nesterov_look(m[n], g[n], momentum, t)
            d[n] = -(orthogonalised(look) + weight_decay * x[n])
            x[n] = x[n] + LR * d[n]
        out.append(d)
    return out


def test_muon_steps_follow_the_rule():
    """The blocks' matrices (the rest take Muon's Adam fallback, or a group's optimizer), over 4 steps."""
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.1)
    grads = gradients(4)
    got = [{n: step[n] for n in BLOCK_WEIGHTS} for step in directions("muon", grads, **hyper)]
    # 5 Newton-Schulz steps in float32 against float64: matmul chains, ~1e-6 of each tensor's scale; 1e-4 in scale
    # (an orthogonalised matrix's error spreads over the whole tensor, as an eigenbasis' does)
    assert_steps_match_in_scale(got, muon_reference(grads, hyper["momentum"], hyper["weight_decay"]), 1e-4)


def polar_express(x: np.ndarray, eps: float = 1e-6, eps_inside: bool = False) -> np.ndarray:
    """The modded-nanogpt speedrun's polar_express (float64, without its bfloat16): X / (||X||_F 1.02 + 1e-6) on the
    wide side, then five steps X <- a X + (b A + c A^2) X, A = X X^T, each with its own (a, b, c). `eps_inside`:
    X / ((||X||_F + eps) 1.02), optax's placement of eps (a difference only for a matrix whose norm is near eps)."""
    coefficients = [
        (8.156554524902461, -22.48329292557795, 15.878769915207462),
        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
    ]
    wide = x.T if x.shape[0] > x.shape[1] else x
    norm = np.linalg.norm(wide)
    y = wide / ((norm + eps) * 1.02 if eps_inside else norm * 1.02 + eps)
    for a, b, c in coefficients:
        gram = y @ y.T
        y = a * y + (b * gram + c * gram @ gram) @ y
    return y.T if x.shape[0] > x.shape[1] else y


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_polar_express_orthogonalises_as_the_speedrun_does(shape):
    from optimizers.muon import polar_express_coefficients

    x = np.random.default_rng(0).standard_normal(shape) * np.geomspace(0.05, 1.0, shape[1])  # spread singular values
    # the orthogonalisation alone: Muon's scaling by momentum 0 (the update is the orthogonalised gradient)
    orthogonalise = optax.contrib.scale_by_muon(polar_express_coefficients(), beta=0.0, nesterov=False, eps=1e-6 / 1.02)
    got, _ = orthogonalise.update(jnp.asarray(x, jnp.float32), orthogonalise.init(jnp.zeros(shape)))
    want = polar_express(x)
    # float32 matmul chains against float64, through five steps whose slopes near 0 multiply to ~1e3: in scale 1e-4
    assert_steps_match_in_scale([{"x": np.asarray(got)}], [{"x": want}], 1e-4)
    singular = np.linalg.svd(want, compute_uv=False)
    assert singular.min() > 0.6 and singular.max() < 1.3, singular  # orthogonal up to Polar Express's band
    assert np.abs(newton_schulz(x) - want).max() > 1e-2  # not Newton-Schulz's polynomial


def test_muon_runs_polar_express_when_asked_and_refuses_other_names():
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.0)
    grads = gradients(1)
    got = directions("muon", grads, orthogonalizer="polar_express", **hyper)
    want = {}
    for n in BLOCK_WEIGHTS:
        # step 1: Nesterov's bias-corrected look-ahead is a multiple of the gradient
        want[n] = -orthogonalised(grads[0][n], lambda a: polar_express(a, 1e-8, eps_inside=True))
    assert_steps_match_in_scale([{n: got[0][n] for n in BLOCK_WEIGHTS}], [want], 1e-4)
    with pytest.raises(ConfigError, match="optimizer.orthogonalizer: must be one of newton_schulz, polar_express"):
        OPTIMIZERS["muon"](MODEL, orthogonalizer="polar", **hyper)
    with pytest.raises(ConfigError, match="optimizer.ns_steps: polar_express's coefficients are for 5 steps; got 4"):
        OPTIMIZERS["muon"](MODEL, orthogonalizer="polar_express", ns_steps=4, **hyper)
    with pytest.raises(ConfigError, match="optimizer.ns_steps: must be >= 1 .*; got 0"):
        OPTIMIZERS["muon"](MODEL, ns_steps=0, **hyper)  # no iteration: the update would not be orthogonalised


def normuon(orth: np.ndarray, second: np.ndarray | None, beta2: float) -> tuple[np.ndarray, np.ndarray]:
    """The speedrun's _apply_normuon_variance_reduction on one [in, out] matrix (its torch weights are [out, in]: a
    statistic per entry of the longer side), float64: the new second moment and the normalised update."""
    axis = 0 if orth.shape[1] >= orth.shape[0] else 1
    mean = np.mean(orth**2, axis=axis, keepdims=True)
    second = (1 - beta2) * mean if second is None else beta2 * second + (1 - beta2) * mean
    step = 1 / np.sqrt(np.maximum(second, 1e-10))
    scaled = orth * step
    return scaled * np.linalg.norm(orth) / max(np.linalg.norm(scaled), 1e-10), second


@pytest.mark.parametrize("cautious", [False, True])
def test_normuon_and_cautious_weight_decay_step_as_the_speedrun_does(cautious):
    """3 steps of Muon with NorMuon's second moment (beta2 0.9) and decay 0.1, cautious or not, against NumPy."""
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.1)
    grads = gradients(3)
    got = directions("muon", grads, normuon_beta2=0.9, cautious_weight_decay=cautious, **hyper)
    x = flat(PARAMS)
    m = {n: np.zeros_like(x[n]) for n in BLOCK_WEIGHTS}
    second = {}
    for t, g in enumerate(grads, start=1):
        want = {}
        for n in BLOCK_WEIGHTS:
            m[n], look = nesterov_look(m[n], g[n], 0.95, t)
            orth = orthogonalised(look)
            layers = []
            for layer in range(orth.shape[0]):
                a = orth[layer].reshape(orth.shape[1], -1)
                normalised, second[n, layer] = normuon(a, second.get((n, layer)), 0.9)
                layers.append(normalised.reshape(orth.shape[1:]))
            direction = np.stack(layers)  # the step is -direction; decay where it moves w towards 0 (cautious)
            decay = 0.1 * x[n] * ((direction * x[n] >= 0) if cautious else 1.0)
            want[n] = -(direction + decay)
            x[n] = x[n] + LR * want[n]
        assert_steps_match_in_scale([{n: got[t - 1][n] for n in BLOCK_WEIGHTS}], [want], 1e-4)
        if cautious:  # the gate leaves some entries undecayed and decays others
            assert 0 < np.mean(decay == 0) < 1
    normalised = got[0]["blocks.fc.weight"][0]  # [in, out] = [32, 128]: one statistic per output neuron
    plain = directions("muon", grads[:1], **hyper)[0]["blocks.fc.weight"][0]
    assert np.std(np.sqrt(np.mean(normalised**2, axis=0))) < 0.5 * np.std(np.sqrt(np.mean(plain**2, axis=0)))


def test_muon_momentum_warms_up_from_its_start_to_its_momentum():
    """Over a warm-up of 4 steps from 0.85 to 0.95, step t (from 0) runs Muon with beta 0.85 + 0.1 min(t / 4, 1)
    (optax's Nesterov look-ahead and bias correction at that beta), against NumPy over 6 steps."""
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.0)
    grads = gradients(6)
    got = directions("muon", grads, momentum_warmup=4, momentum_start=0.85, **hyper)
    m = {n: np.zeros_like(v) for n, v in flat(PARAMS).items() if n in BLOCK_WEIGHTS}
    for t, g in enumerate(grads, start=1):
        b = 0.85 + 0.1 * min((t - 1) / 4, 1.0)
        want = {}
        for n in BLOCK_WEIGHTS:
            m[n], look = nesterov_look(m[n], g[n], b, t)
            want[n] = -orthogonalised(look)
        assert_steps_match_in_scale([{n: got[t - 1][n] for n in BLOCK_WEIGHTS}], [want], 1e-4)
    steady = directions("muon", grads, **hyper)
    assert np.abs(got[1]["blocks.fc.weight"] - steady[1]["blocks.fc.weight"]).max() > 1e-3  # the warm-up shows


@pytest.mark.parametrize("cooldown", [3, 0.5])  # steps, or a fraction of the run's 6
def test_muon_momentum_cools_down_over_the_runs_last_steps(cooldown):
    """A warm-up of 2 steps and a cool-down of the run's last 3 (6 steps, from 0.95 towards 0.85): step t (from 0)
    runs Muon with beta 0.85 + 0.1 min(t / 2, 1), and past step 3 with beta 0.95 - 0.1 (t - 3) / 3, the speedrun's
    rule, against NumPy. A cool-down with no run length to end at is one line."""
    hyper = dict(momentum=0.95, nesterov=True, beta1=0.9, beta2=0.95, weight_decay=0.0)
    grads = gradients(6)
    schedule = dict(momentum_warmup=2, momentum_start=0.85, momentum_cooldown=cooldown, momentum_end=0.85)
    got = directions("muon", grads, **schedule, run_steps=6, **hyper)
    m = {n: np.zeros_like(v) for n, v in flat(PARAMS).items() if n in BLOCK_WEIGHTS}
    betas = []
    for t, g in enumerate(grads, start=1):
        b = 0.85 + 0.1 * min((t - 1) / 2, 1.0) if t - 1 <= 3 else 0.95 - 0.1 * (t - 1 - 3) / 3
        betas.append(b)
        want = {}
        for n in BLOCK_WEIGHTS:
            m[n], look = nesterov_look(m[n], g[n], b, t)
            want[n] = -orthogonalised(look)
        assert_steps_match_in_scale([{n: got[t - 1][n] for n in BLOCK_WEIGHTS}], [want], 1e-4)
    assert betas[-2:] == pytest.approx([0.95 - 0.1 / 3, 0.95 - 0.2 / 3])  # falling at the end
    with pytest.raises(ConfigError, match=r"^config: optimizer.momentum_cooldown: the cool-down ends with the run"):
        OPTIMIZERS["muon"](MODEL, **schedule, **hyper)
    with pytest.raises(ConfigError, match=r"^config: unknown key 'optimizer.run_steps'"):  # the run's, no key
        load_config(["optimizer=muon", "optimizer.run_steps=6"])


def test_muon_momentum_holds_its_end_after_the_run_and_never_jumps_above_its_warm_up():
    """The cool-down stops at momentum_end past the schedule's end (lr_config.max_steps < train.max_steps); where a
    warm-up is unfinished when the cool-down starts, momentum is the lower of the two; a tiny fraction is one step."""
    from optimizers.muon import momentum_schedule

    beta = momentum_schedule(0.95, 0, 0.85, 10, 0.85, 100)
    assert [float(beta(c)) for c in (90, 100, 200, 999)] == pytest.approx([0.95, 0.85, 0.85, 0.85])
    beta = momentum_schedule(0.95, 8, 0.85, 5, 0.85, 10)
    warm = [0.85 + 0.1 * min(c / 8, 1) for c in range(10)]
    cool = [0.95 - 0.1 * min(max(c - 5, 0) / 5, 1) for c in range(10)]
    assert [float(beta(c)) for c in range(10)] == pytest.approx([min(w, k) for w, k in zip(warm, cool)])
    assert float(momentum_schedule(0.95, 0, 0.85, 0.004, 0.85, 100)(100)) == pytest.approx(0.85)  # 0.4 steps: 1, not 0
