"""One chunk of a chunked LM head: logits into a buffer, softmax statistics, the logits' gradient.

The heads of :mod:`~cosmos_primitives.algo.logprobs` and :mod:`~cosmos_primitives.algo.fused_logprob_loss`
walk their rows (scored tokens) ``chunk_size`` at a time. Each chunk's logits ``z = hidden @ W.T`` go
into ONE ``[rows, V]`` buffer in the weight's dtype (a GEMM with ``out=``): bf16 logits are rounded to
bf16 by the GEMM whatever buffer they land in (the numerics of HF's ``lm_head(h).float()``), so a
float32 buffer would cost twice the memory for no precision. An epilogue computes in float32 (float64
for float64 weights) from that buffer:

- the statistics ``lse = log sum_j exp z_j``, ``log p(target) = z_target - lse`` and optionally the
  entropy ``H = lse - sum_j p_j z_j``;
- the gradient of a loss with per-row upstream gradients ``g_lp = dL/dlog p(target)`` and
  ``g_ent = dL/dH``::

      dL/dz_j = g_lp (1[j = target] - p_j) - g_ent p_j (log p_j + H)

  written over the buffer in place (weight's dtype), which then feeds the gradient GEMMs
  ``grad_hidden[rows] = G @ W`` and ``grad_W += G.T @ hidden[rows]``. ``grad_W`` accumulates over
  chunks in the weight's dtype (as Liger-Kernel's fused linear cross-entropy does): each chunk's GEMM
  sums its rows in float32 and rounds once, so bf16 adds one rounding per chunk (16 chunks: 2.9x
  the relative error of one bf16 GEMM over all tokens, ~0.5 %; ``tests/test_logprobs.py``), while a
  float32 ``[V, H]`` accumulator (890 MiB at 151,936 x 1,536) would break the head's memory target
  (1/10 of naive float32 logits) at 2,048-token chunks.

Two epilogues with the same math:

- ``"eager"``: torch ops over column blocks of the buffer, so float32 temporaries are
  ``[rows, block]``; runs on any device and is the reference;
- ``"compiled"``: the same math in two ``torch.compile``d functions; inductor fuses each into one
  kernel that reads the buffer and writes ``[rows]`` statistics, or the gradient over the buffer in
  place (checked in its generated code: only ``[rows]`` buffers are allocated), so the buffer is
  read a few times instead of a dozen float32 passes over each block. The default on CUDA
  (``"auto"``), where the eager blocks are bandwidth- and launch-bound; the first calls compile
  (seconds, once per process and dtype; the row count turns dynamic at the second chunk size).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

EPILOGUES = ("auto", "eager", "compiled")

BLOCK_COLUMNS = 8192
"""Vocabulary columns per block of the eager epilogue: its float32 temporaries are ``[rows, block]``
(64 MiB each at 2,048 rows). Wider blocks were no faster on a CPU (within noise); on a GPU a block of
2,048 x 8,192 is ~16M elements per kernel, enough to hide the launch."""


def softmax_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """float32 for the softmax, float64 kept (for gradcheck-grade references)."""
    return torch.float64 if weight_dtype == torch.float64 else torch.float32


def resolve_epilogue(epilogue: str, device: torch.device) -> str:
    """``"eager"`` or ``"compiled"``: ``"auto"`` is compiled on CUDA with a working Triton, else eager."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {EPILOGUES}, got {epilogue!r}")
    if epilogue != "auto":
        return epilogue
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return "compiled" if has_triton() else "eager"
    return "eager"


class HeadChunks:
    """The chunks of one head pass over ``hidden`` [N, H] against ``weight`` [V, H] (same dtype),
    and the buffers every chunk reuses: ``logits`` [min(chunk_size, N), V] in the weight's dtype
    and, for the eager epilogue, up to two float32 ``[rows, block]`` scratch blocks (``block``
    columns, default :data:`BLOCK_COLUMNS`)."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, chunk_size: int, epilogue: str = "auto",
                 block: int | None = None) -> None:
        self.hidden, self.weight, self.chunk_size = hidden, weight, chunk_size
        self.n_tokens, self.vocab = hidden.shape[0], weight.shape[0]
        self.dtype = softmax_dtype(weight.dtype)
        self.compiled = resolve_epilogue(epilogue, weight.device) == "compiled"
        rows = min(chunk_size, self.n_tokens)
        self.logits = hidden.new_empty(rows, self.vocab, dtype=weight.dtype)
        self.block = min(self.vocab, block or BLOCK_COLUMNS)
        self._scratch: list[torch.Tensor] = []

    def slices(self) -> Iterator[slice]:
        """Row ranges of the chunks, in order."""
        for start in range(0, self.n_tokens, self.chunk_size):
            yield slice(start, min(start + self.chunk_size, self.n_tokens))

    def chunk_logits(self, rows: slice) -> torch.Tensor:
        """``[n, V]`` logits of ``hidden[rows]`` in the shared buffer (the weight's dtype)."""
        out = self.logits[: rows.stop - rows.start]
        torch.mm(self.hidden[rows], self.weight.t(), out=out)
        return out

    def scratch(self, count: int, rows: int) -> list[torch.Tensor]:
        """``count`` float32 ``[rows, block]`` scratch blocks, allocated on first use."""
        while len(self._scratch) < count:
            self._scratch.append(self.logits.new_empty(self.logits.shape[0], self.block, dtype=self.dtype))
        return [s[:rows] for s in self._scratch[:count]]

    def stats(self, z: torch.Tensor, targets: torch.Tensor,
              with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(logp, lse, entropy or None)``, each ``[n]`` float32, of the logits ``z`` [n, V] and
        ``targets`` [n]; ``z`` is left as it was."""
        if self.compiled:
            return _compiled_stats(with_entropy)(z, targets, self.dtype)
        return self._stats_eager(z, targets, with_entropy)

    def logits_grad_(self, z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g_lp: torch.Tensor,
                     g_ent: torch.Tensor | None = None, entropy: torch.Tensor | None = None) -> torch.Tensor:
        """Overwrite the logits ``z`` [n, V] with ``dL/dz`` (its dtype) and return it.

        ``lse``, ``g_lp`` [n] and, for an entropy term, ``g_ent`` and ``entropy`` [n] (float32)."""
        if self.compiled:
            _compiled_grad()(z, targets, lse, g_lp, g_ent, entropy, self.dtype)
            return z
        return self._grad_eager_(z, targets, lse, g_lp, g_ent, entropy)

    def add_head_grads(self, grad_logits: torch.Tensor, rows: slice, grad_hidden: torch.Tensor | None,
                       grad_weight: torch.Tensor | None, first: bool) -> None:
        """``grad_hidden[rows] = G @ W`` and ``grad_weight (=|+=) G.T @ hidden[rows]`` (``first``: =),
        for ``G`` = ``grad_logits`` [n, V]; either target may be None (not needed)."""
        if grad_hidden is not None:
            torch.mm(grad_logits, self.weight, out=grad_hidden[rows])
        if grad_weight is not None:
            if first:
                torch.mm(grad_logits.t(), self.hidden[rows], out=grad_weight)
            else:
                grad_weight.addmm_(grad_logits.t(), self.hidden[rows])

    def _blocks(self, z: torch.Tensor) -> Iterator[tuple[torch.Tensor, int]]:
        for start in range(0, self.vocab, self.block):
            block = z[:, start : start + self.block]
            yield block, block.shape[1]

    def _stats_eager(self, z: torch.Tensor, targets: torch.Tensor,
                     with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        n = z.shape[0]
        row_max = z.amax(dim=1).to(self.dtype)
        total = z.new_zeros(n, dtype=self.dtype)
        dot = z.new_zeros(n, dtype=self.dtype) if with_entropy else None
        scratch = self.scratch(2 if with_entropy else 1, n)
        for block, width in self._blocks(z):
            shifted = torch.sub(block, row_max[:, None], out=scratch[0][:, :width])
            if dot is None:
                total += shifted.exp_().sum(dim=1)
                continue
            exp = torch.exp(shifted, out=scratch[1][:, :width])
            total += exp.sum(dim=1)
            # sum_j e_j (z_j - max), the product written over the shifted logits (no longer needed):
            # no third [n, block] temporary, and on a CPU half the time of a batched dot product (bmm)
            dot += shifted.mul_(exp).sum(dim=1)
        log_total = total.log()
        lse = row_max + log_total
        logp = z.gather(1, targets[:, None]).squeeze(1).to(self.dtype) - lse
        # H = lse - sum p z = log(total) - sum_j e_j (z_j - max) / total
        entropy = log_total - dot / total if dot is not None else None
        return logp, lse, entropy

    def _grad_eager_(self, z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g_lp: torch.Tensor,
                     g_ent: torch.Tensor | None, entropy: torch.Tensor | None) -> torch.Tensor:
        n = z.shape[0]
        target_grad = _target_grad(z.gather(1, targets[:, None]).squeeze(1).to(self.dtype), lse, g_lp, g_ent,
                                   entropy)
        lse_c, g_lp_c = lse[:, None], g_lp[:, None]
        # logits already in the softmax dtype (float32 weights) are overwritten in place: no float32
        # copy of each block, and one pass less over it
        in_place = z.dtype == self.dtype
        scratch = self.scratch(int(not in_place) + int(g_ent is not None), n)
        for block, width in self._blocks(z):
            logp = block.sub_(lse_c) if in_place else torch.sub(block, lse_c, out=scratch[0][:, :width])
            if g_ent is None:
                grad = logp.exp_().mul_(-g_lp_c)
            else:
                p = torch.exp(logp, out=scratch[-1][:, :width])
                grad = logp.add_(entropy[:, None]).mul_(g_ent[:, None]).add_(g_lp_c).mul_(p).neg_()
            if not in_place:
                block.copy_(grad)
        return z.scatter_(1, targets[:, None], target_grad[:, None].to(z.dtype))


def _target_grad(z_target: torch.Tensor, lse: torch.Tensor, g_lp: torch.Tensor, g_ent: torch.Tensor | None,
                 entropy: torch.Tensor | None) -> torch.Tensor:
    """``dL/dz`` at each row's target column, ``[n]``: ``1 - p`` as ``-expm1(log p)`` keeps its
    precision where the target is nearly certain."""
    logp = z_target - lse
    grad = -g_lp * torch.expm1(logp)
    if g_ent is not None:
        grad = grad - g_ent * logp.exp() * (logp + entropy)
    return grad


def _stats_math(z: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    zf = z.to(dtype)
    row_max = zf.amax(dim=1, keepdim=True)
    shifted = zf - row_max
    exp = shifted.exp()
    total = exp.sum(dim=1)
    log_total = total.log()
    lse = row_max.squeeze(1) + log_total
    logp = zf.gather(1, targets[:, None]).squeeze(1) - lse
    entropy = log_total - (exp * shifted).sum(dim=1) / total if with_entropy else None
    return logp, lse, entropy


def _grad_math_(z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g_lp: torch.Tensor,
                g_ent: torch.Tensor | None, entropy: torch.Tensor | None, dtype: torch.dtype) -> None:
    zf = z.to(dtype)
    logp = zf - lse[:, None]
    p = logp.exp()
    if g_ent is None:
        grad = -p * g_lp[:, None]
    else:
        grad = -p * (g_lp[:, None] + g_ent[:, None] * (logp + entropy[:, None]))
    target_grad = _target_grad(zf.gather(1, targets[:, None]).squeeze(1), lse, g_lp, g_ent, entropy)
    hit = torch.arange(z.shape[1], device=z.device)[None, :] == targets[:, None]
    z.copy_(torch.where(hit, target_grad[:, None], grad).to(z.dtype))


@functools.cache
def _compiled_stats(with_entropy: bool):
    """The compiled statistics, one graph per entropy setting; dynamo makes the row count dynamic
    after the second distinct chunk size."""

    def stats(z: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype):
        return _stats_math(z, targets, dtype, with_entropy)

    return torch.compile(stats, dynamic=None)


@functools.cache
def _compiled_grad():
    """The compiled in-place gradient (inductor writes it over the logits buffer)."""
    return torch.compile(_grad_math_, dynamic=None)
