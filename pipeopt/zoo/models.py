"""Architectures of the model zoo as per-sample layer lists (see :mod:`pipeopt.zoo.shapes`).

Each function returns ``list[LayerSpec]`` in a topological order, the first entry the input
(data-loading) node. Granularity: single operators for AlexNet and VGG16 (as in PipeDream's
profiles of them), inception branches for GoogLeNet (a DAG), bottleneck blocks for ResNet50,
attention and MLP sub-blocks for the transformers.

References
----------
.. [AlexNet] Krizhevsky, Sutskever, Hinton, ImageNet Classification with Deep Convolutional
   Neural Networks, NeurIPS 2012 (section 3.5 and figure 2: the two-GPU network, 227x227 input).
.. [GoogLeNet] Szegedy et al., Going Deeper with Convolutions, CVPR 2015, doi
   10.1109/CVPR.2015.7298594 (table 1; auxiliary classifiers left out).
.. [VGG] Simonyan, Zisserman, Very Deep Convolutional Networks for Large-Scale Image
   Recognition, ICLR 2015, arXiv:1409.1556 (configuration D).
.. [ResNet] He, Zhang, Ren, Sun, Deep Residual Learning for Image Recognition, CVPR 2016, doi
   10.1109/CVPR.2016.90 (table 1, 50 layers; stride on the 3x3 convolution as in torchvision's
   "v1.5").
.. [BERT] Devlin, Chang, Lee, Toutanova, BERT: Pre-training of Deep Bidirectional Transformers
   for Language Understanding, NAACL 2019, doi 10.18653/v1/N19-1423 (BERT-Large: L=24,
   H=1024, A=16).
.. [GPT2] Radford et al., Language Models are Unsupervised Multitask Learners, OpenAI 2019
   (GPT-2 XL: 48 layers, d=1600, context 1024, vocabulary 50257).
.. [GPT3] Brown et al., Language Models are Few-Shot Learners, NeurIPS 2020, arXiv:2005.14165
   (table 2.1: GPT-3 6.7B: 32 layers, d=4096, 32 heads, context 2048).
.. [LLaMA] Touvron et al., LLaMA: Open and Efficient Foundation Language Models,
   arXiv:2302.13971, 2023 (table 2: LLaMA-7B: 32 layers, d=4096, 32 heads; section 2.2:
   pre-normalisation with RMSNorm, SwiGLU with hidden size 2/3 x 4d, rotary embeddings;
   context 2048; SentencePiece vocabulary of 32k tokens). The FFN width 11008 (2/3 x 4 x 4096
   rounded up to a multiple of 256) and the untied output layer are those of the released
   model (Meta's reference implementation, ``llama/model.py``).
"""

from __future__ import annotations

from .shapes import CNN, LayerSpec, attention_unit, mlp_unit, rotary_attention_unit, swiglu_unit


def alexnet() -> list[LayerSpec]:
    """AlexNet [AlexNet]_: 5 convolutions (2, 4 and 5 grouped in two, as split over the
    paper's two GPUs), LRN after the first two, 3 max-pools, 3 fully connected layers,
    dropout on the first two. 60.97 M parameters, 0.72 G MACs per 227x227 image."""
    n = CNN()
    x = n.input("input", 3, 227, 227)
    x = n.conv("conv1", x, 96, 11, stride=4)
    x = n.relu("relu1", x)
    x = n.lrn("norm1", x)
    x = n.pool("pool1", x, 3, 2)
    x = n.conv("conv2", x, 256, 5, pad=2, groups=2)
    x = n.relu("relu2", x)
    x = n.lrn("norm2", x)
    x = n.pool("pool2", x, 3, 2)
    x = n.conv("conv3", x, 384, 3, pad=1)
    x = n.relu("relu3", x)
    x = n.conv("conv4", x, 384, 3, pad=1, groups=2)
    x = n.relu("relu4", x)
    x = n.conv("conv5", x, 256, 3, pad=1, groups=2)
    x = n.relu("relu5", x)
    x = n.pool("pool5", x, 3, 2)
    x = n.fc("fc6", x, 4096)
    x = n.relu("relu6", x)
    x = n.dropout("drop6", x)
    x = n.fc("fc7", x, 4096)
    x = n.relu("relu7", x)
    x = n.dropout("drop7", x)
    n.fc("fc8", x, 1000)
    return n.layers


def vgg16() -> list[LayerSpec]:
    """VGG16 [VGG]_ (configuration D): 13 3x3 convolutions with ReLU, 5 max-pools, 3 fully
    connected layers with dropout. 138.36 M parameters, 15.5 G MACs per 224x224 image."""
    n = CNN()
    x = n.input("input", 3, 224, 224)
    cfg = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    for b, block in enumerate(cfg, 1):
        for i, c in enumerate(block, 1):
            x = n.conv(f"conv{b}_{i}", x, c, 3, pad=1)
            x = n.relu(f"relu{b}_{i}", x)
        x = n.pool(f"pool{b}", x, 2, 2)
    x = n.fc("fc6", x, 4096)
    x = n.relu("relu6", x)
    x = n.dropout("drop6", x)
    x = n.fc("fc7", x, 4096)
    x = n.relu("relu7", x)
    x = n.dropout("drop7", x)
    n.fc("fc8", x, 1000)
    return n.layers


# GoogLeNet table 1: (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj)
_INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def googlenet() -> list[LayerSpec]:
    """GoogLeNet [GoogLeNet]_ as a DAG: every inception module is four branches (1x1; 1x1 ->
    3x3; 1x1 -> 5x5; 3x3 max-pool -> 1x1) joined by a concatenation node; every convolution
    node includes its ReLU. LRN in the stem as in the paper; the auxiliary classifiers
    (training-time only, weight 0.3) are left out. 6.99 M parameters, 1.6 G MACs per image."""
    n = CNN()
    x = n.input("input", 3, 224, 224)
    x = n.conv("conv1", x, 64, 7, stride=2, pad=3, relu=True)
    x = n.pool("pool1", x, 3, 2, ceil=True)
    x = n.lrn("norm1", x)
    x = n.conv("conv2_reduce", x, 64, 1, relu=True)
    x = n.conv("conv2", x, 192, 3, pad=1, relu=True)
    x = n.lrn("norm2", x)
    x = n.pool("pool2", x, 3, 2, ceil=True)
    for name, (c1, c3r, c3, c5r, c5, pp) in _INCEPTION.items():
        if name in ("4a", "5a"):
            x = n.pool(f"pool{name[0]}", x, 3, 2, ceil=True)
        p = f"inc{name}"
        b1 = n.conv(f"{p}_1x1", x, c1, 1, relu=True)
        b2 = n.conv(f"{p}_3x3_reduce", x, c3r, 1, relu=True)
        b2 = n.conv(f"{p}_3x3", b2, c3, 3, pad=1, relu=True)
        b3 = n.conv(f"{p}_5x5_reduce", x, c5r, 1, relu=True)
        b3 = n.conv(f"{p}_5x5", b3, c5, 5, pad=2, relu=True)
        b4 = n.pool(f"{p}_pool", x, 3, 1, pad=1, ceil=True)
        b4 = n.conv(f"{p}_pool_proj", b4, pp, 1, relu=True)
        x = n.concat(f"{p}_concat", [b1, b2, b3, b4])
    x = n.global_avgpool("avgpool", x)
    x = n.dropout("dropout", x)
    n.fc("fc", x, 1000)
    return n.layers


def resnet50() -> list[LayerSpec]:
    """ResNet50 [ResNet]_ as a chain of units: stem convolution, max-pool, 16 bottleneck
    blocks (each one node: 1x1, 3x3, 1x1 convolutions with batch norm, the projection
    shortcut where the shape changes, the residual add and ReLU), global average pool, fully
    connected layer. 25.56 M parameters, 4.09 G MACs per 224x224 image."""
    n = CNN()
    x = n.input("input", 3, 224, 224)
    x = n.conv("conv1", x, 64, 7, stride=2, pad=3, bias=False, bn=True, relu=True)
    x = n.pool("pool1", x, 3, 2, pad=1)
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], 1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            scratch = CNN()
            scratch.layers, scratch.shape = [], {"x": n.shape[x]}
            y = scratch.conv("a", "x", width, 1, bias=False, bn=True, relu=True)
            y = scratch.conv("b", y, width, 3, stride=s, pad=1, bias=False, bn=True, relu=True)
            y = scratch.conv("c", y, 4 * width, 1, bias=False, bn=True)
            if b == 0:
                scratch.conv("down", "x", 4 * width, 1, stride=s, bias=False, bn=True)
            c, h, w = scratch.shape[y]
            add = LayerSpec("add", "add+ReLU", (), 0, 2 * c * h * w, 0, c * h * w, 2 * c * h * w)
            op = f"Bottleneck({n.shape[x][0]}->{width}->{4 * width}, stride {s}" + (
                ", projection)" if b == 0 else ")"
            )
            x = n.unit(f"layer{stage}_{b}", op, (x,), [*scratch.layers, add], (c, h, w))
    x = n.global_avgpool("avgpool", x)
    n.fc("fc", x, 1000)
    return n.layers


# ---- transformers ------------------------------------------------------------------------
def _transformer(
    *, s: int, h: int, a: int, layers: int, vocab: int, positions: int, types: int, ffn: int, encoder: bool
) -> list[LayerSpec]:
    if s > positions:
        raise ValueError(f"sequence length {s} exceeds the model's {positions} positions")
    specs = [
        LayerSpec("input", f"Input(token ids, s={s})", (), out=s, is_input=True, in_bytes_per_element=8),
        LayerSpec(
            "embed",
            f"Embedding(vocab={vocab}, positions={positions}"
            + (f", types={types})" if types else ")")
            + (" + LayerNorm" if encoder else "")
            + " + Dropout",
            ("input",),
            0,
            (3 + (5 if encoder else 0) + 1) * s * h,
            (vocab + positions + types) * h + (2 * h if encoder else 0),
            s * h,
            (2 if encoder else 1) * s * h,
            s * h,
        ),
    ]
    prev = "embed"
    for i in range(layers):
        att = attention_unit(f"layer{i}_attn", prev, s=s, h=h, a=a)
        mlp = mlp_unit(f"layer{i}_mlp", att.name, s=s, h=h, ffn=ffn)
        specs += [att, mlp]
        prev = mlp.name
    if encoder:  # BERT pre-training heads: pooler + NSP, MLM transform + decoder tied to the embedding
        macs = h * h + 2 * h + s * h * h + s * h * vocab
        params = (h * h + h) + (2 * h + 2) + (h * h + h + 2 * h) + vocab + vocab * h
        flop = 2 * macs + 10 * s * h + 5 * s * vocab
        out, saved = 1, 2 * s * h + h + 2 * s * vocab
        op = f"Pooler + NSP + MLM head (decoder tied to the embedding, vocab={vocab}) + loss"
    else:  # final layer norm + LM head tied to the embedding + loss
        macs = s * h * vocab
        params = 2 * h + vocab * h
        flop = 2 * macs + 5 * s * h + 5 * s * vocab
        out, saved = 1, s * h + 2 * s * vocab
        op = f"LayerNorm + LM head (tied to the embedding, vocab={vocab}) + loss"
    specs.append(LayerSpec("head", op, (prev,), macs, flop, params, out, saved, shared=vocab * h))
    return specs


def bert_large(seq_len: int = 512) -> list[LayerSpec]:
    """BERT-Large [BERT]_ for pre-training (masked LM + next sentence): embedding, 24 x
    (attention, MLP), heads. 335 M distinct parameters (the head keeps a copy of the 31 M
    word-embedding matrix, see ``LayerSpec.shared``)."""
    return _transformer(
        s=seq_len, h=1024, a=16, layers=24, vocab=30522, positions=512, types=2, ffn=4096, encoder=True
    )


GPT_CONFIGS = {
    "gpt2-xl": {"h": 1600, "a": 25, "layers": 48, "positions": 1024, "ref": "Radford et al. 2019"},
    "gpt3-6.7b": {"h": 4096, "a": 32, "layers": 32, "positions": 2048, "ref": "Brown et al. 2020, table 2.1"},
}
"""Shapes of the GPT-style decoders (vocabulary 50257, MLP width 4h, pre-layer-norm)."""


def gpt(config: str = "gpt2-xl", seq_len: int | None = None) -> list[LayerSpec]:
    """A GPT-style decoder [GPT2]_ [GPT3]_: embedding (tokens + positions), ``layers`` x
    (attention, MLP) with pre-layer-norm, final norm + LM head tied to the embedding.
    GPT-2 XL: 1.558 G parameters; GPT-3 6.7B: 6.66 G. ``seq_len`` defaults to the context."""
    c = GPT_CONFIGS[config]
    s = c["positions"] if seq_len is None else seq_len
    return _transformer(
        s=s,
        h=c["h"],
        a=c["a"],
        layers=c["layers"],
        vocab=50257,
        positions=c["positions"],
        types=0,
        ffn=4 * c["h"],
        encoder=False,
    )


LLAMA_CONFIGS = {
    "llama-7b": {"h": 4096, "a": 32, "layers": 32, "ffn": 11008, "vocab": 32000, "positions": 2048,
                 "ref": "Touvron et al. 2023, table 2"},
}
"""Shapes of the LLaMA-style decoders [LLaMA]_ (RMSNorm, SwiGLU, rotary positions, no biases,
no dropout, output layer not tied to the embedding)."""


def llama(config: str = "llama-7b", seq_len: int | None = None) -> list[LayerSpec]:
    """A LLaMA-style decoder [LLaMA]_: token embedding (no position table: rotary positions
    sit in the attention), ``layers`` x (attention, SwiGLU MLP) with RMSNorm before each,
    final RMSNorm + output layer (its own weights, not tied to the embedding) + loss.

    Counted with the conventions of the zoo's GPT blocks (:func:`gpt`,
    :mod:`pipeopt.zoo.shapes`): per sub-block :func:`~pipeopt.zoo.shapes.rotary_attention_unit`
    and :func:`~pipeopt.zoo.shapes.swiglu_unit`; the head as GPT's (saves its input, the logits
    and their softmax). LLaMA-7B: 6.74 G parameters (the paper's 6.7B). ``seq_len`` defaults
    to the context, 2048.
    """
    c = LLAMA_CONFIGS[config]
    s = c["positions"] if seq_len is None else seq_len
    if s > c["positions"]:
        raise ValueError(f"sequence length {s} exceeds the model's {c['positions']} positions")
    h, a, vocab = c["h"], c["a"], c["vocab"]
    specs = [
        LayerSpec("input", f"Input(token ids, s={s})", (), out=s, is_input=True, in_bytes_per_element=8),
        # a gather: ~1 FLOP per output element; keeps nothing but the token ids (the input's)
        LayerSpec("embed", f"Embedding(vocab={vocab})", ("input",), 0, s * h, vocab * h, s * h, 0, 0),
    ]
    prev = "embed"
    for i in range(c["layers"]):
        att = rotary_attention_unit(f"layer{i}_attn", prev, s=s, h=h, a=a)
        mlp = swiglu_unit(f"layer{i}_mlp", att.name, s=s, h=h, ffn=c["ffn"])
        specs += [att, mlp]
        prev = mlp.name
    macs = s * h * vocab
    specs.append(
        LayerSpec(
            "head",
            f"RMSNorm + output layer (vocab={vocab}, untied) + loss",
            (prev,),
            macs,
            2 * macs + 5 * s * h + 5 * s * vocab,
            h + vocab * h,
            1,
            s * h + 2 * s * vocab,
        )
    )
    return specs
