"""scripts/benchmarks/torch_profile.py on a model.py written here with nanoGPT's interface (GPT, GPTConfig,
configure_optimizers, forward(x, y) -> (logits, loss)) and the operators nanoGPT's model calls: every category gets
the time of its own operators, and the categories add up to the step."""

import textwrap

import pytest

from scripts.benchmarks import torch_profile

MODEL_PY = textwrap.dedent(
    """
    from dataclasses import dataclass
    import torch
    import torch.nn.functional as F
    from torch import nn

    @dataclass
    class GPTConfig:
        block_size: int
        vocab_size: int
        n_layer: int
        n_head: int
        n_embd: int
        dropout: float
        bias: bool

    class GPT(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c
            self.wte = nn.Embedding(c.vocab_size, c.n_embd)
            self.ln = nn.LayerNorm(c.n_embd, bias=c.bias)
            self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
            self.fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
            self.proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.wte(idx)
            q, k, v = self.qkv(self.ln(x)).view(B, T, 3, self.c.n_head, -1).transpose(1, 3).unbind(2)
            x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + self.proj(F.gelu(self.fc(self.ln(x))))
            logits = x @ self.wte.weight.t()
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
    """
)


def test_each_category_gets_its_operators_and_they_add_up_to_the_step(tmp_path):
    (tmp_path / "model.py").write_text(MODEL_PY)
    args = torch_profile.parse(
        [f"--nanogpt={tmp_path}", "--n-layer=1", "--n-head=2", "--n-embd=32", "--context=16", "--vocab=61",
         "--batch=2", "--steps=2", "--warmup=1"]
    )  # fmt: skip
    result = torch_profile.profile(args)
    ms = result["ms"]
    assert set(ms) == set(torch_profile.CATEGORIES)
    for name in ("matmul", "attention", "elementwise", "head_loss", "optimizer"):
        assert ms[name] > 0, name
    # self times: an operator's time is counted once, not again in the operator that called it
    operators = sum(v for k, v in ms.items() if k != "overhead")
    assert operators <= 1.05 * result["step_ms"]
    assert operators + ms["overhead"] == pytest.approx(result["step_ms"])
    assert len(result["step_ms_each"]) == 2 and result["shape"]["vocab"] == 61
    table = torch_profile.table(result)
    assert table.count("\n| ") == len(torch_profile.CATEGORIES) + 1  # the header and a row per category


@pytest.mark.parametrize(
    "name, shapes, in_optimizer, category",
    [
        ("aten::mm", "[[32, 384], [384, 1152]]", False, "matmul"),
        ("aten::mm", "[[4096, 384], [384, 259]]", False, "head_loss"),  # the vocabulary's matmul is the head's
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "[]", False, "attention"),
        ("aten::mul_", "[[384]]", True, "optimizer"),  # called by the optimizer's step
        ("aten::copy_", "[]", False, "copy"),
        ("aten::native_layer_norm", "[]", False, "elementwise"),
    ],
)
def test_operators_are_classified_by_name_shape_and_caller(name, shapes, in_optimizer, category):
    assert torch_profile.classify(name, shapes, 259, in_optimizer) == category


def test_a_path_without_model_py_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        torch_profile.parse([f"--nanogpt={tmp_path}"])
    assert e.value.code == 2 and "no model.py there" in capsys.readouterr().err
