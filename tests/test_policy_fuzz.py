"""Property-based fuzzing of the torch-free runtime (her_mpi_runtime.Policy) with hypothesis.

Every input either gives a finite action of the right shape and type inside the policy's bounds,
identical to what onnxruntime computes on the float32 input, or raises PolicyInputError; nothing
else escapes (no other exception type, no numpy warning).
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from deploy_policies import exported_policy
from her_mpi_runtime import Policy, PolicyInputError

FLOAT32_MAX = float(np.finfo(np.float32).max)
NUMERIC_DTYPES = ["float16", "float32", "float64", ">f4", ">f8", "int8", "int16", "int32", "int64",
                  "uint8", "uint16", "uint32", "uint64"]
OTHER_DTYPES = ["bool", "complex64", "complex128", "U6", "S6", "datetime64[s]", "timedelta64[s]", "object"]
FUZZ = settings(max_examples=600, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", params=["fetch_reach", "bitflip"])
def policy(request, tmp_path_factory):
    return Policy(exported_policy(tmp_path_factory, request.param))


@st.composite
def policy_input(draw, dim: int, batch: int | None):
    """One observation or goal: mostly well-formed numbers with the odd poisoned value, sometimes
    another dtype, shape or Python type entirely."""
    kind = draw(st.sampled_from(["array"] * 6 + ["list", "other_dtype", "other_shape", "python"]))
    if kind == "python":
        return draw(st.one_of(st.none(), st.text(max_size=12), st.binary(max_size=12), st.floats(),
                              st.integers(), st.dictionaries(st.text(max_size=3), st.floats(), max_size=3),
                              st.lists(st.one_of(st.floats(), st.integers(), st.text(max_size=2), st.none()),
                                       max_size=2 * dim),
                              st.lists(st.lists(st.floats(), min_size=0, max_size=dim + 2), max_size=4)))
    shape = (dim,) if batch is None else (batch, dim)
    if kind == "other_shape":
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=dim + 3))
    dtype = np.dtype(draw(st.sampled_from(OTHER_DTYPES if kind == "other_dtype" else NUMERIC_DTYPES)))
    if dtype.kind == "f":
        elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)
    elif dtype.kind == "O":
        elements = st.one_of(st.floats(), st.none(), st.text(max_size=2))
    else:
        elements = hnp.from_dtype(dtype)
    array = draw(hnp.arrays(dtype, shape, elements=elements))
    if array.size and dtype.kind == "f":
        poison = draw(st.sampled_from([None] * 4 + [np.nan, np.inf, -np.inf, 1e39, -3e300, 1e308]))
        if poison is not None:
            flat = array.reshape(-1)
            with np.errstate(over="ignore"):  # 1e39 in float16/float32 is Inf: poisoned either way
                flat[draw(st.integers(0, flat.size - 1))] = poison
    if kind == "list":
        return array.tolist()
    if array.ndim == 2 and array.shape[0] > 1 and draw(st.booleans()):
        array = array[::-1]  # a non-contiguous view
    return array


def rejection_reason(value, dim: int):
    """What the runtime must refuse about one input (None: nothing), or the float32 array it acts on."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            array = np.asarray(value)
    except (ValueError, TypeError, OverflowError, Warning):
        return "not an array", None
    if array.dtype.kind not in "iuf":
        return f"dtype {array.dtype}", None
    if array.ndim not in (1, 2) or array.shape[-1] != dim:
        return f"shape {array.shape}", None
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return "non-finite", None
    if array.size and np.abs(array.astype(np.float64)).max() > FLOAT32_MAX:
        return "out of float32 range", None
    return None, array.astype(np.float32)


def test_policy_accepts_good_input_and_refuses_everything_else(policy, record_property):
    meta = policy.metadata
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # as the runtime's session
    reference = ort.InferenceSession(str(policy.path), options, providers=["CPUExecutionProvider"])
    outcomes = Counter()

    @FUZZ
    @given(data=st.data())
    def check(data):
        batch = data.draw(st.sampled_from([None, None, 0, 1, 2, 5]), label="batch")
        obs = data.draw(policy_input(meta.obs_dim, batch), label="observation")
        goal_batch = batch if data.draw(st.integers(0, 9), label="same batch") else data.draw(
            st.sampled_from([None, 0, 1, 3]), label="goal batch")
        goal = data.draw(policy_input(meta.goal_dim, goal_batch), label="desired_goal")
        obs_problem, obs32 = rejection_reason(obs, meta.obs_dim)
        goal_problem, goal32 = rejection_reason(goal, meta.goal_dim)
        if not obs_problem and not goal_problem and obs32.shape[:-1] != goal32.shape[:-1]:
            obs_problem = "batch shapes differ"

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a numpy warning is a silent change of the input
            try:
                action = policy.act(obs, goal)
            except PolicyInputError as exc:
                assert obs_problem or goal_problem, f"refused good input: {exc}"
                assert str(exc)
                outcomes["refused"] += 1
                return
        assert not obs_problem and not goal_problem, f"accepted bad input ({obs_problem or goal_problem})"
        width = 1 if meta.discrete else meta.action_dim
        assert action.shape == obs32.shape[:-1] + (width,)
        expected = reference.run(["action"], {"observation": obs32.reshape(-1, meta.obs_dim),
                                              "desired_goal": goal32.reshape(-1, meta.goal_dim)})[0]
        np.testing.assert_array_equal(action.reshape(-1, width), expected)
        if meta.discrete:
            assert action.dtype == np.int64 and np.all((action >= 0) & (action < meta.n_actions))
        else:
            assert action.dtype == np.float32 and np.isfinite(action).all()
            assert np.all((action >= meta.action_low) & (action <= meta.action_high))
        outcomes["acted, empty batch" if action.size == 0 else "acted"] += 1

    check()
    print(f"\n{meta.env_id} policy fuzz: {dict(outcomes)}")
    record_property("fuzz_cases", dict(outcomes))
    # the generator must really reach both sides, else the property says little
    assert outcomes["acted"] >= 60 and outcomes["refused"] >= 60, outcomes
