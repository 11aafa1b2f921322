"""Small models whose failure on a real backend needs what the user's model declares (issue 23).

* :func:`bilstm_tagger`: IREE 3.13 (llvm-cpu) miscompiles a bidirectional LSTM fed by an embedding ``Gather``
  when the token ids' batch and sequence dimensions are dynamic: the tags' probabilities are off by ~0.1–0.5
  against ONNX Runtime and onnx.reference. With both dimensions fixed it computes correctly, and so it does
  when the LSTM's unused ``Y_h``/``Y_c`` are graph outputs, or when the embedded tokens are a graph input (the
  Gather cut away). The failing core is the Gather and the LSTM, fed with token ids of dynamic shape.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["BILSTM_CORE", "bilstm_inputs", "bilstm_tagger"]

#: the nodes a minimal failing BiLSTM tagger keeps
BILSTM_CORE = ("embed", "bilstm")

_BATCH, _SEQ, _EMBED, _HIDDEN, _VOCAB, _TAGS = 3, 5, 4, 4, 10, 4


def bilstm_tagger(*, dynamic: bool = True) -> onnx.ModelProto:
    """``tokens: INT64[batch, seq]`` → embedding → BiLSTM → per-token tag probabilities ``[batch, seq, 4]``
    (8 nodes); ``dynamic=False`` declares the tokens ``[3, 5]``, the size :func:`bilstm_inputs` feeds."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.standard_normal((2, 4 * _HIDDEN, _EMBED)) * 0.5,
               "R": rng.standard_normal((2, 4 * _HIDDEN, _HIDDEN)) * 0.5,
               "B": rng.standard_normal((2, 8 * _HIDDEN)) * 0.1, "E": rng.standard_normal((_VOCAB, _EMBED)),
               "Wo": rng.standard_normal((2 * _HIDDEN, _TAGS)), "bo": rng.standard_normal(_TAGS) * 0.1}
    inits = [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()]
    inits.append(numpy_helper.from_array(np.array([0, 0, 2 * _HIDDEN], np.int64), "merge_shape"))
    nodes = [helper.make_node("Transpose", ["tokens"], ["time_major"], perm=[1, 0], name="time_major"),
             helper.make_node("Gather", ["E", "time_major"], ["embedded"], name="embed"),
             helper.make_node("LSTM", ["embedded", "W", "R", "B"], ["Y", "Y_h", "Y_c"], hidden_size=_HIDDEN,
                              direction="bidirectional", name="bilstm"),
             helper.make_node("Transpose", ["Y"], ["Y_t"], perm=[2, 0, 1, 3], name="batch_major"),
             helper.make_node("Reshape", ["Y_t", "merge_shape"], ["features"], name="merge_directions"),
             helper.make_node("MatMul", ["features", "Wo"], ["logits"], name="project"),
             helper.make_node("Add", ["logits", "bo"], ["scores"], name="bias"),
             helper.make_node("Softmax", ["scores"], ["tags"], axis=-1, name="softmax")]
    batch, seq = ("batch", "seq") if dynamic else (_BATCH, _SEQ)
    graph = helper.make_graph(nodes, "bilstm_tagger",
                              [helper.make_tensor_value_info("tokens", TensorProto.INT64, [batch, seq])],
                              [helper.make_tensor_value_info("tags", TensorProto.FLOAT, [batch, seq, _TAGS])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def bilstm_inputs() -> dict[str, np.ndarray]:
    return {"tokens": np.random.default_rng(1).integers(0, _VOCAB, (_BATCH, _SEQ)).astype(np.int64)}
