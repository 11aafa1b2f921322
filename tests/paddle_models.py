"""Small Paddle inference models for tests, exported with random weights (no downloads).

Paddle is imported inside the functions: test modules that import these helpers skip cleanly
(``pytest.importorskip("paddle")``) where Paddle is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CONV_NET_INPUT", "DECODER_INPUT", "export_branch_net", "export_cast_net", "export_conv_net",
           "export_greedy_decoder", "export_mobilenet_v2", "export_transformer_block", "mobilenet_v2_errors", "ort_run"]

#: Input name and shape of :func:`export_conv_net` models (batch is dynamic in the exported program).
CONV_NET_INPUT = ("x", (2, 3, 16, 16))


def _conv_net(seed: int) -> Any:
    import paddle

    class ConvNet(paddle.nn.Layer):
        """conv+bias → batch norm → relu → conv+bias → relu → mean → linear; outputs (logits, features).

        On a CPU build of Paddle 3.3.1 with oneDNN this fires conv2d_bias_bn_onednn_fuse_pass,
        conv2d_bias_fuse_pass and conv_activation_mkldnn_fuse_pass (logged name) among others.
        """

        def __init__(self) -> None:
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
            self.bn = paddle.nn.BatchNorm2D(8)
            self.conv2 = paddle.nn.Conv2D(8, 8, 3, padding=1)
            self.fc = paddle.nn.Linear(8, 4)

        def forward(self, x: Any) -> tuple[Any, Any]:
            y = paddle.nn.functional.relu(self.bn(self.conv(x)))
            y = paddle.nn.functional.relu(self.conv2(y))
            features = y.mean(axis=[2, 3])
            return self.fc(features), features

    paddle.seed(seed)
    net = ConvNet()
    # Non-trivial batch-norm statistics, so a wrong BN fusion would show in the outputs.
    net.bn._mean.set_value(paddle.rand([8]) - 0.5)
    net.bn._variance.set_value(paddle.rand([8]) + 0.5)
    net.eval()
    return net


def export_conv_net(directory: Path, *, legacy: bool = False, seed: int = 0) -> Path:
    """Export the conv/bn/linear test net to ``directory/inference.{json|pdmodel,pdiparams}``; return the prefix.

    ``legacy=True`` writes a legacy ``.pdmodel`` program (old IR) instead of a PIR ``.json``.
    """
    import paddle

    net = _conv_net(seed)
    prefix = Path(directory) / "inference"
    spec = [paddle.static.InputSpec([None, 3, 16, 16], "float32", CONV_NET_INPUT[0])]
    if legacy:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(prefix), input_spec=spec)
    else:
        paddle.jit.save(net, str(prefix), input_spec=spec)
    return prefix


def export_cast_net(directory: Path, input_dtype: str, output_dtype: str, *, n: int = 4) -> Path:
    """Export ``y = cast(float32(x)² · w, output_dtype)`` (``w`` = 1, a parameter so a .pdiparams is written)
    with an ``x`` of ``input_dtype`` and shape [n]; return the prefix."""
    import paddle

    class CastNet(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.w = self.create_parameter([n], dtype="float32",
                                           default_initializer=paddle.nn.initializer.Constant(1.0))

        def forward(self, x: Any) -> Any:
            c = paddle.cast(x, "float32")
            return paddle.cast(c * c * self.w, output_dtype)

    net = CastNet()
    net.eval()
    prefix = Path(directory) / "inference"
    paddle.jit.save(net, str(prefix), input_spec=[paddle.static.InputSpec([n], input_dtype, "x")])
    return prefix


def export_mobilenet_v2(directory: Path, *, size: int = 64, seed: int = 0, legacy: bool = False) -> Path:
    """Export ``paddle.vision.models.mobilenet_v2`` (random weights, scale 0.5, 10 classes); return the prefix.

    ``legacy=True`` writes a legacy ``.pdmodel`` program (old IR), whose oneDNN bf16 op types
    ``Config.set_bfloat16_op`` controls (Paddle 3.3.1 PIR programs ignore it).
    """
    import paddle
    from paddle.vision.models import mobilenet_v2

    paddle.seed(seed)
    net = mobilenet_v2(pretrained=False, scale=0.5, num_classes=10)
    # Random init with default BN statistics (mean 0, var 1) shrinks activations to ~1e-6 by the classifier,
    # and random statistics make the net chaotic (float rounding differences grow to O(1)). Calibrate
    # instead: one train-mode pass with momentum 0 sets every BN's statistics to the batch's own.
    for layer in net.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._momentum = 0.0
    net.train()
    calibration = np.random.default_rng(seed).standard_normal((8, 3, size, size)).astype("float32")
    with paddle.no_grad():
        net(paddle.to_tensor(calibration))
    net.eval()
    prefix = Path(directory) / "inference"
    spec = [paddle.static.InputSpec([None, 3, size, size], "float32", "x")]
    if legacy:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(prefix), input_spec=spec)
    else:
        paddle.jit.save(net, str(prefix), input_spec=spec)
    return prefix


def mobilenet_v2_errors(directory: Path) -> tuple[Path, dict[str, np.ndarray], Callable[[str], float]]:
    """:func:`export_mobilenet_v2` under ``directory``, its 1×3×64×64 input, and the largest difference of a Paddle
    spec's output (each run in a fresh worker) from ONNX Runtime's, optimizations off, on its conversion."""
    from graphbisect.backends import BackendProcess
    from graphbisect.model import load_model

    prefix = export_mobilenet_v2(Path(directory) / "mnv2")
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    with BackendProcess("onnxruntime:opt_level=disable", workdir=Path(directory) / "oracle") as proc:
        expected = np.asarray(next(iter(proc.run(load_model(prefix).path, feeds).outputs.values())))

    def error(spec: str) -> float:
        with BackendProcess(spec, workdir=Path(directory) / "direct") as proc:
            got = np.asarray(proc.run(prefix, feeds).outputs["fetch_name_0"])
        return float(np.max(np.abs(got - expected)))

    return prefix, feeds, error


def export_transformer_block(directory: Path, *, seq: int = 8, d_model: int = 32, seed: int = 0) -> Path:
    """Export one ``paddle.nn.TransformerEncoderLayer`` (4 heads, GELU, random weights) over an embedding
    projection; input ``x`` of shape ``[batch, seq, d_model]``. Returns the prefix."""
    import paddle

    class Block(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.proj = paddle.nn.Linear(d_model, d_model)
            self.layer = paddle.nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, activation="gelu")

        def forward(self, x: Any) -> Any:
            return self.layer(self.proj(x))

    paddle.seed(seed)
    net = Block()
    net.eval()
    prefix = Path(directory) / "inference"
    paddle.jit.save(net, str(prefix), input_spec=[paddle.static.InputSpec([None, seq, d_model], "float32", "x")])
    return prefix


#: Input name and shape of :func:`export_greedy_decoder` models (batch is dynamic in the exported program).
DECODER_INPUT = ("tokens", (2, 4))


def export_greedy_decoder(directory: Path, *, steps: int, vocab: int = 16, d_model: int = 8, seed: int = 0) -> Path:
    """Export a greedy decoder whose one ``nn.Embedding`` is called twice: on the prompt (``tokens``, int64
    ``[batch, 4]``), then inside a ``while`` loop on each decoded token, ``steps`` times; one ``nn.Linear``
    scores the prompt, each step and, after the loop, twice the state. Outputs (logits, last token).

    Paddle 3.3.1 runs the loop body as a block of its own, whose op labels restart at 0: with a CPU build the
    prompt's ``pd_op.embedding:0`` and the body's are one label, hooked once before the loop and once per
    iteration. Returns the prefix.
    """
    import paddle

    class Decoder(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = paddle.nn.Embedding(vocab, d_model)
            self.proj = paddle.nn.Linear(d_model, vocab)

        def forward(self, tokens: Any) -> tuple[Any, Any]:
            h = paddle.tanh(self.embedding(tokens).mean(axis=1))
            token = paddle.argmax(self.proj(h), axis=-1)
            i = paddle.zeros([1], dtype="int64")
            while i < steps:  # dygraph-to-static: a while op with the body as its block
                h = h + self.embedding(token)
                token = paddle.argmax(self.proj(h), axis=-1)
                i = i + 1
            return self.proj(h * 2.0), token

    paddle.seed(seed)
    net = Decoder()
    net.eval()
    prefix = Path(directory) / "inference"
    paddle.jit.save(net, str(prefix), input_spec=[paddle.static.InputSpec([None, 4], "int64", DECODER_INPUT[0])])
    return prefix


def export_branch_net(directory: Path, *, vocab: int = 16, d_model: int = 8, seed: int = 0) -> Path:
    """Export a net whose one ``nn.Embedding`` is called on ``tokens`` (int64 ``[batch, 4]``) and again, on the
    first token, in the taken branch of a data-dependent ``if`` (a block of its own, run once); the branch's
    condition reads ``sum``, a 0-D tensor of the program that paddle2onnx writes as [1]. Output: logits.
    Returns the prefix."""
    import paddle

    class BranchNet(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = paddle.nn.Embedding(vocab, d_model)
            self.proj = paddle.nn.Linear(d_model, vocab)

        def forward(self, tokens: Any) -> Any:
            h = paddle.tanh(self.embedding(tokens).mean(axis=1))
            if h.sum() > -100.0:  # noqa: SIM108 (dygraph-to-static: an if op with each branch as its block)
                h = h + self.embedding(tokens[:, 0])
            else:
                h = h - 1.0
            return self.proj(h * 2.0)

    paddle.seed(seed)
    net = BranchNet()
    net.eval()
    prefix = Path(directory) / "inference"
    paddle.jit.save(net, str(prefix), input_spec=[paddle.static.InputSpec([None, 4], "int64", DECODER_INPUT[0])])
    return prefix


def ort_run(onnx_path: Path | str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX model on ONNX Runtime (CPU, no graph optimizations) and return outputs by name."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))
