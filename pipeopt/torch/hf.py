"""Hugging Face transformers models by class name, built from their config class (random
weights, nothing downloaded), with one microbatch of example inputs.

``pipeopt profile hf:GPT2LMHeadModel --model-arg n_layer=12`` and
``pipeopt.torch.models.load("hf:GPT2LMHeadModel", n_layer=12)`` come here: the class is looked
up in ``transformers``, its config class is the class's ``config_class``, and every keyword
argument that is not one of the input sizes below overrides a field of that config (a field
the config does not have is an error, so a typo is not silently ignored). The model is built
in training mode with ``use_cache=False`` (a training step keeps no KV cache) after
``torch.manual_seed(seed)``, so two builds have equal weights (``pipeopt run`` builds the model
once per process).

Example inputs follow the model's ``main_input_name``:

* ``input_ids`` (text): token ids of shape (``batch``, ``seq``), uniform over the vocabulary;
  an encoder-decoder (``config.is_encoder_decoder``) also gets ``decoder_input_ids`` of the
  same shape. ``seq`` defaults to :data:`DEFAULT_SEQ`, at most the model's position limit;
* ``pixel_values`` (vision): images of shape (``batch``, ``config.num_channels``, ``image``,
  ``image``), ``image`` default ``config.image_size`` (224 if the config has none).

The inputs are positional arguments in the order of the model's ``forward`` (``None`` for an
argument between two given ones: T5's ``attention_mask`` before ``decoder_input_ids``).

``transformers`` is optional: ``pip install "pipeopt[hf]"``.
"""

from __future__ import annotations

import difflib
import inspect
import numbers

import torch
from torch import nn

from ..errors import InvalidProblemError, MissingExtraError

DEFAULT_SEQ = 128
"""Tokens per sequence of a text model's example inputs (capped at the model's positions)."""

DEFAULT_BATCH = 2
"""Sequences or images per microbatch."""

DEFAULT_IMAGE = 224
"""Image side of a vision model whose config has no ``image_size``."""

INSTALL = 'pip install "pipeopt[hf]" (Hugging Face transformers)'


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise MissingExtraError(f"hf: models need transformers, which is not installed: {INSTALL}") from exc
    return transformers


def model_class(name: str):
    """The transformers class ``name`` (``"GPT2LMHeadModel"``).

    Raises
    ------
    MissingExtraError
        If transformers is not installed.
    InvalidProblemError
        If transformers has no model class of that name (the message suggests close names),
        or the class has no ``config_class``.
    """
    tf = _transformers()
    cls = getattr(tf, name, None) if name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        close = difflib.get_close_matches(name, [n for n in dir(tf) if n[:1].isupper()], n=5)
        raise InvalidProblemError(f"transformers has no model class {name!r}"
                                  + (f"; close names: {close}" if close else ""))
    if getattr(cls, "config_class", None) is None:
        raise InvalidProblemError(f"transformers' {name} has no config_class to build it from")
    return cls


def _positions(config) -> int | None:
    for key in ("n_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _size(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidProblemError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def build(name: str, *, batch: int = DEFAULT_BATCH, seq: int | None = None, image: int | None = None,
          seed: int = 0, **config) -> tuple[nn.Module, tuple]:
    """The transformers model ``name`` from its config class and one microbatch of inputs.

    Parameters
    ----------
    name
        A model class of transformers (``"GPT2LMHeadModel"``, ``"BertForMaskedLM"``,
        ``"LlamaForCausalLM"``, ``"T5ForConditionalGeneration"``, ``"ViTModel"``, ...).
    batch
        Sequences or images per microbatch.
    seq
        Tokens per sequence (text models; default :data:`DEFAULT_SEQ`, capped at the
        model's positions).
    image
        Image side in pixels (vision models; default ``config.image_size`` or
        :data:`DEFAULT_IMAGE`).
    seed
        Seeds the weights and the inputs.
    **config
        Fields of the model's config class (``n_layer=2``, ``hidden_size=64``).

    Returns
    -------
    (module, example_inputs)
        The model in training mode and a tuple of positional inputs (module docstring).

    Raises
    ------
    MissingExtraError
        Without transformers.
    InvalidProblemError
        Unknown class or config field, a size that is not a positive integer, a model whose
        main input is neither ``input_ids`` nor ``pixel_values``, or a config the class
        refuses (transformers' reason quoted).
    """
    cls = model_class(name)
    batch = _size(batch, "batch")
    config_cls = cls.config_class
    try:
        defaults = config_cls()
    except Exception as exc:  # noqa: BLE001 - a config class that needs arguments
        raise InvalidProblemError(f"{config_cls.__name__}() cannot be built with its defaults: {exc}") from None
    unknown = [k for k in config if not hasattr(defaults, k)]
    if unknown:
        fields = sorted(k for k in defaults.to_dict() if not k.startswith("_"))
        raise InvalidProblemError(f"{config_cls.__name__} has no field {unknown[0]!r} (model {name}); "
                                  f"its fields include {fields[:40]}")
    if hasattr(defaults, "use_cache"):
        config.setdefault("use_cache", False)
    torch.manual_seed(seed)
    try:
        cfg = config_cls(**config)
        module = cls(cfg)
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError, TypeError, AssertionError, ...
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise InvalidProblemError(f"transformers cannot build {name} with {config}: {type(exc).__name__}: "
                                  f"{reason}") from None
    gen = torch.Generator().manual_seed(seed)
    main = getattr(module, "main_input_name", "input_ids")
    given: dict = {}
    if main == "input_ids":
        limit = _positions(cfg)
        seq = _size(seq, "seq") if seq is not None else min(DEFAULT_SEQ, limit or DEFAULT_SEQ)
        if limit is not None and seq > limit:
            raise InvalidProblemError(f"seq {seq} exceeds {name}'s {limit} positions")
        vocab = _size(getattr(cfg, "vocab_size", None), f"{config_cls.__name__}.vocab_size")
        given["input_ids"] = torch.randint(0, vocab, (batch, seq), generator=gen)
        if getattr(cfg, "is_encoder_decoder", False):
            given["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), generator=gen)
    elif main == "pixel_values":
        side = _size(image if image is not None else getattr(cfg, "image_size", None) or DEFAULT_IMAGE, "image")
        channels = _size(getattr(cfg, "num_channels", 3), "num_channels")
        given["pixel_values"] = torch.randn(batch, channels, side, side, generator=gen)
    else:
        raise InvalidProblemError(f"{name}'s main input is {main!r}; pipeopt builds inputs for 'input_ids' (text) "
                                  "and 'pixel_values' (vision) models: write a factory returning (model, inputs)")
    return module.train(), _positional(module, given)


def _positional(module: nn.Module, given: dict) -> tuple:
    """``given`` as positional arguments of ``module.forward`` (``None`` between them)."""
    params = [p.name for p in inspect.signature(module.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    missing = [k for k in given if k not in params]
    if missing:
        raise InvalidProblemError(f"{type(module).__name__}.forward takes no positional argument {missing[0]!r}")
    last = max(params.index(k) for k in given)
    return tuple(given.get(p) for p in params[: last + 1])
