"""Per-layer FLOP, parameter and activation counts computed from tensor shapes.

The zoo describes every architecture as a list of :class:`LayerSpec` records **per sample**
(one image, or one sequence of ``s`` tokens) and **per element** (no bytes yet); the build
step (:mod:`pipeopt.zoo.build`) multiplies by the microbatch size and the bytes per element
and turns FLOP into seconds with the device catalogue.

Counting conventions (stated once, used everywhere):

* ``macs``: multiply-accumulates of convolutions and matrix products.
* ``flop`` (forward) = 2 x ``macs`` + elementwise work (bias add, ReLU, batch norm, pooling
  window reads, LRN, softmax, layer norm, GELU), counted at a few FLOP per element as noted
  in each builder. So ResNet50's "4.1 GFLOPs" of the literature (which are multiply-adds)
  is 4.1e9 ``macs`` and about 8.2e9 ``flop`` here.
* Backward FLOP = 2 x forward FLOP for every layer (gradients w.r.t. the inputs and the
  weights each cost about one forward pass; Kaplan et al. 2020, Narayanan et al. 2021). The
  build step applies it.
* ``out``: elements of the tensor the layer sends to each successor.
* ``saved``: elements kept for the backward pass: every tensor the layer produces (no
  in-place operations, no recomputation), and for transformer blocks the tensors counted by
  Korthikanti et al. (2022); ``mask``: dropout-mask elements, stored as one byte each.
* ``params``: trainable parameters (batch-norm scale and shift included, running statistics
  excluded). ``shared`` counts parameters that duplicate another layer's (a language-model
  head tied to the embedding: the last pipeline stage keeps its own copy, as Megatron-LM does).

References
----------
Kaplan et al., Scaling Laws for Neural Language Models, arXiv:2001.08361, 2020 (backward = 2x
forward). Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM, SC 2021, doi 10.1145/3458817.3476209 (transformer FLOP 24bsh^2 + 4bs^2h per layer).
Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models,
arXiv:2205.05198, 2022 (activation memory sbh(34 + 5as/h) bytes per layer at 16 bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerSpec:
    """One layer (graph node) of an architecture, per sample, in elements.

    Attributes
    ----------
    name
        Node name.
    op
        Short description (``"Conv2d(3->96, 11x11/4)"``), stored as the node's ``op``.
    inputs
        Names of the layers feeding this one (``()`` for the input node).
    macs
        Multiply-accumulates per sample.
    flop
        Forward FLOP per sample (2 x ``macs`` + elementwise work).
    params
        Trainable parameters.
    out
        Output elements per sample (sent along every outgoing edge).
    saved
        Elements kept for the backward pass per sample.
    mask
        Dropout-mask elements kept per sample (one byte each).
    shared
        Parameters duplicating another layer's (tied weights), included in ``params``.
    is_input
        Data-loading node (pinned to the first stage, no compute).
    in_bytes_per_element
        For the input node: bytes per element of the raw input (8 for int64 token ids);
        ``None`` = the model's activation element size.
    """

    name: str
    op: str
    inputs: tuple
    macs: float = 0.0
    flop: float = 0.0
    params: int = 0
    out: int = 0
    saved: float = 0.0
    mask: float = 0.0
    shared: int = 0
    is_input: bool = False
    in_bytes_per_element: int | None = None


def _pool_out(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    n = (size + 2 * p - k) / s
    out = (math.ceil(n) if ceil else math.floor(n)) + 1
    if ceil and (out - 1) * s >= size + p:  # PyTorch/Caffe rule: the last window starts inside
        out -= 1
    return out


class CNN:
    """Shape-tracking builder of convolutional networks (channels, height, width per sample).

    Every method appends one :class:`LayerSpec` and returns its name, so branches are written
    as ``b = net.conv("b", src, ...)``.
    """

    def __init__(self) -> None:
        self.layers: list[LayerSpec] = []
        self.shape: dict[str, tuple[int, int, int]] = {}

    def _add(self, spec: LayerSpec, shape: tuple[int, int, int]) -> str:
        if spec.name in self.shape:
            raise ValueError(f"layer {spec.name!r} defined twice")
        self.layers.append(spec)
        self.shape[spec.name] = shape
        return spec.name

    def input(self, name: str, c: int, h: int, w: int) -> str:
        """The input image batch (``c x h x w`` per sample)."""
        return self._add(LayerSpec(name, f"Input({c}x{h}x{w})", (), out=c * h * w, is_input=True), (c, h, w))

    def conv(
        self,
        name: str,
        src: str,
        cout: int,
        k: int,
        *,
        stride: int = 1,
        pad: int = 0,
        groups: int = 1,
        bias: bool = True,
        bn: bool = False,
        relu: bool = False,
    ) -> str:
        """Convolution (+ batch norm, + ReLU when asked, in the same node).

        FLOP: 2 per MAC, + 1 per output element for the bias, + 2 for batch norm (scale,
        shift), + 1 for ReLU. Saved: the output of each op in the node.
        """
        c, h, w = self.shape[src]
        if c % groups or cout % groups:
            raise ValueError(f"{name}: channels {c}->{cout} not divisible by groups={groups}")
        ho = (h + 2 * pad - k) // stride + 1
        wo = (w + 2 * pad - k) // stride + 1
        out = cout * ho * wo
        macs = out * (c // groups) * k * k
        params = cout * (c // groups) * k * k + (cout if bias else 0) + (2 * cout if bn else 0)
        ew = (1 if bias else 0) + (2 if bn else 0) + (1 if relu else 0)
        saved = out * (1 + int(bn) + int(relu))
        parts = [f"Conv2d({c}->{cout}, {k}x{k}/{stride}" + (f", groups={groups}" if groups > 1 else "") + ")"]
        if bn:
            parts.append("BatchNorm2d")
        if relu:
            parts.append("ReLU")
        spec = LayerSpec(name, " + ".join(parts), (src,), macs, 2 * macs + ew * out, params, out, saved)
        return self._add(spec, (cout, ho, wo))

    def relu(self, name: str, src: str) -> str:
        """ReLU as its own node (1 FLOP per element)."""
        c, h, w = self.shape[src]
        n = c * h * w
        return self._add(LayerSpec(name, "ReLU", (src,), 0, n, 0, n, n), (c, h, w))

    def lrn(self, name: str, src: str, size: int = 5) -> str:
        """Local response normalisation across ``size`` channels (Krizhevsky et al. 2012):
        about ``size + 3`` FLOP per element (window sum of squares, scale, power, divide)."""
        c, h, w = self.shape[src]
        n = c * h * w
        return self._add(
            LayerSpec(name, f"LocalResponseNorm({size})", (src,), 0, (size + 3) * n, 0, n, n), (c, h, w)
        )

    def pool(
        self, name: str, src: str, k: int, stride: int, *, pad: int = 0, ceil: bool = False, kind: str = "max"
    ) -> str:
        """Max or average pooling: ``k*k`` FLOP per output element."""
        c, h, w = self.shape[src]
        ho, wo = _pool_out(h, k, stride, pad, ceil), _pool_out(w, k, stride, pad, ceil)
        out = c * ho * wo
        op = f"{'MaxPool2d' if kind == 'max' else 'AvgPool2d'}({k}x{k}/{stride})"
        return self._add(LayerSpec(name, op, (src,), 0, k * k * out, 0, out, out), (c, ho, wo))

    def global_avgpool(self, name: str, src: str) -> str:
        """Average over the whole feature map (1 FLOP per input element)."""
        c, h, w = self.shape[src]
        return self._add(LayerSpec(name, "AdaptiveAvgPool2d(1)", (src,), 0, c * h * w, 0, c, c), (c, 1, 1))

    def dropout(self, name: str, src: str) -> str:
        """Dropout: 1 FLOP per element; keeps its output and a one-byte mask."""
        c, h, w = self.shape[src]
        n = c * h * w
        return self._add(LayerSpec(name, "Dropout", (src,), 0, n, 0, n, n, mask=n), (c, h, w))

    def fc(self, name: str, src: str, cout: int, *, relu: bool = False) -> str:
        """Fully connected layer on the flattened input (+ ReLU when asked)."""
        c, h, w = self.shape[src]
        cin = c * h * w
        macs = cin * cout
        ew = 1 + int(relu)
        op = f"Linear({cin}->{cout})" + (" + ReLU" if relu else "")
        spec = LayerSpec(
            name, op, (src,), macs, 2 * macs + ew * cout, cin * cout + cout, cout, cout * (1 + int(relu))
        )
        return self._add(spec, (cout, 1, 1))

    def concat(self, name: str, srcs: list[str]) -> str:
        """Channel concatenation (a copy: no FLOP; keeps its output)."""
        shapes = [self.shape[s] for s in srcs]
        h, w = shapes[0][1:]
        if any(s[1:] != (h, w) for s in shapes):
            raise ValueError(f"{name}: cannot concatenate maps of sizes {[s[1:] for s in shapes]}")
        c = sum(s[0] for s in shapes)
        n = c * h * w
        return self._add(
            LayerSpec(name, f"Concat({len(srcs)} branches)", tuple(srcs), 0, 0, 0, n, n), (c, h, w)
        )

    def unit(
        self, name: str, op: str, inputs: tuple, parts: list[LayerSpec], shape: tuple[int, int, int]
    ) -> str:
        """A node made of several layers (a residual block): sums their counts."""
        spec = LayerSpec(
            name,
            op,
            tuple(inputs),
            macs=sum(p.macs for p in parts),
            flop=sum(p.flop for p in parts),
            params=sum(p.params for p in parts),
            out=shape[0] * shape[1] * shape[2],
            saved=sum(p.saved for p in parts),
            mask=sum(p.mask for p in parts),
        )
        return self._add(spec, shape)


# ---- transformer pieces (per sequence of s tokens, hidden size h, a heads) ----------------
def attention_unit(name: str, src: str, *, s: int, h: int, a: int, with_norm: bool = True) -> LayerSpec:
    """Self-attention sub-block: [layer norm], QKV projection, scores, softmax, dropout,
    weighted sum, output projection, dropout (+ residual add).

    FLOP (Narayanan et al. 2021): ``8 s h^2 + 4 s^2 h`` for the products, + ~5 per softmax
    element, + ~5 per element for the norm, the residual and the dropouts. Saved
    (Korthikanti et al. 2022, attention + one layer norm): ``6 s h + 2 a s^2`` elements and
    ``s h + a s^2`` one-byte masks (at 16 bits: 13 s h + 5 a s^2 bytes).
    """
    macs = 4 * s * h * h + 2 * s * s * h
    flop = 2 * macs + 5 * a * s * s + (5 if with_norm else 3) * s * h
    params = 4 * h * h + 4 * h + (2 * h if with_norm else 0)
    return LayerSpec(
        name,
        f"SelfAttention(h={h}, heads={a}, s={s})" + (" + LayerNorm" if with_norm else ""),
        (src,),
        macs,
        flop,
        params,
        s * h,
        6 * s * h + 2 * a * s * s,
        s * h + a * s * s,
    )


def mlp_unit(name: str, src: str, *, s: int, h: int, ffn: int, with_norm: bool = True) -> LayerSpec:
    """Feed-forward sub-block: [layer norm], ``h -> ffn`` projection, GELU, ``ffn -> h``
    projection, dropout (+ residual add).

    FLOP: ``4 s h ffn`` for the products (16 s h^2 when ffn = 4h), + ~8 per GELU element, +
    ~5 per element for the norm, residual and dropout. Saved (Korthikanti et al. 2022 with
    ffn = 4h: 21 s h bytes at 16 bits): ``2 s h + 2 s ffn`` elements and ``s h`` masks.
    """
    macs = 2 * s * h * ffn
    flop = 2 * macs + 8 * s * ffn + 5 * s * h
    params = 2 * h * ffn + ffn + h + (2 * h if with_norm else 0)
    return LayerSpec(
        name,
        f"MLP({h}->{ffn}->{h}, GELU)" + (" + LayerNorm" if with_norm else ""),
        (src,),
        macs,
        flop,
        params,
        s * h,
        2 * s * h + 2 * s * ffn,
        s * h,
    )


# ---- LLaMA-style pieces: RMSNorm, no biases, no dropout, rotary positions, SwiGLU ------------
def rotary_attention_unit(name: str, src: str, *, s: int, h: int, a: int) -> LayerSpec:
    """LLaMA's self-attention sub-block (Touvron et al. 2023): RMSNorm, QKV projection without
    biases, rotary position embedding on Q and K, scores, softmax, weighted sum, output
    projection (+ residual add); no dropout.

    FLOP: the products as :func:`attention_unit` (``8 s h^2 + 4 s^2 h``), + ~5 per softmax
    element, + ~4 per element for RMSNorm, 1 for the residual and ~3 per element of Q and K
    for the rotation (``11 s h``). Saved, counted as Korthikanti et al. (2022) count
    :func:`attention_unit`'s tensors, less what dropout adds: the norm's input, the QKV
    input, Q and K (rotated), the softmax output (also the weighted sum's input), V and the
    output projection's input: ``6 s h + a s^2`` elements, no masks (at 16 bits ``12 s h + 2 a
    s^2`` bytes).
    """
    macs = 4 * s * h * h + 2 * s * s * h
    flop = 2 * macs + 5 * a * s * s + 11 * s * h
    params = 4 * h * h + h  # Wq, Wk, Wv, Wo without biases; RMSNorm weight
    return LayerSpec(
        name,
        f"SelfAttention(h={h}, heads={a}, s={s}, rotary, no bias) + RMSNorm",
        (src,),
        macs,
        flop,
        params,
        s * h,
        6 * s * h + a * s * s,
        0,
    )


def swiglu_unit(name: str, src: str, *, s: int, h: int, ffn: int) -> LayerSpec:
    """LLaMA's feed-forward sub-block (Touvron et al. 2023; Shazeer 2020, GLU variants):
    RMSNorm, gate and up projections ``h -> ffn`` without biases, ``SiLU(gate) * up``, down
    projection ``ffn -> h`` (+ residual add); no dropout.

    FLOP: ``6 s h ffn`` for the three products, + ~5 per ``ffn`` element (SiLU ~4, the
    product 1), + ~5 per ``h`` element (RMSNorm ~4, residual 1). Saved, every tensor autograd
    keeps (as :func:`mlp_unit` counts): the norm's input and output (the two projections'
    shared input), gate (SiLU's input), up and SiLU(gate) (the product's inputs) and their
    product (the down projection's input): ``2 s h + 4 s ffn`` elements, no masks.
    """
    macs = 3 * s * h * ffn
    flop = 2 * macs + 5 * s * ffn + 5 * s * h
    params = 3 * h * ffn + h
    return LayerSpec(
        name,
        f"SwiGLU MLP({h}->{ffn}->{h}, no bias) + RMSNorm",
        (src,),
        macs,
        flop,
        params,
        s * h,
        2 * s * h + 4 * s * ffn,
        0,
    )
