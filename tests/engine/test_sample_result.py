"""SampleResult holds the top-K as [tokens, K] int32 / float32 arrays whatever it is given,
compares by value, and writes plain JSON; a Sequence's rows come back in order."""

import json

import numpy as np
import pytest

from sparrow.engine.sequence import SampleResult
from sparrow.token_arrays import TokenRows


def result(topk_ids, topk_logprobs, n=2):
    return SampleResult(
        0, 1, tuple(range(n)), (-0.5,) * n, topk_ids, topk_logprobs, (3,) * n, "length"
    )


def test_nested_tuples_become_arrays_and_compare_equal_to_them():
    tuples = result(((5, 7), (6, 8)), ((-0.5, -2.0), (-1.5, -1.75)))
    arrays = result(np.array([[5, 7], [6, 8]], np.int64), np.array([[-0.5, -2.0], [-1.5, -1.75]]))
    for r in (tuples, arrays):
        assert r.topk_ids.dtype == np.int32 and r.topk_ids.shape == (2, 2)
        assert r.topk_logprobs.dtype == np.float32
    assert tuples == arrays
    assert tuples != result(((5, 7), (6, 9)), ((-0.5, -2.0), (-1.5, -1.75)))
    assert json.loads(json.dumps(tuples.to_dict()))["topk_ids"] == [[5, 7], [6, 8]]
    with pytest.raises(TypeError):
        hash(tuples)


def test_no_top_k_and_no_tokens_keep_their_token_count():
    none = result(((), ()), ((), ()))
    assert none.topk_ids.shape == (2, 0) and none.topk_logprobs.shape == (2, 0)
    empty = result((), (), n=0)
    assert empty.topk_ids.shape == (0, 0)
    with pytest.raises(ValueError, match="disagree in length"):
        result(((5,),), ((-1.0,),), n=2)


def test_token_rows_grow_and_return_a_copy_in_order():
    rows = TokenRows(np.int32)
    assert rows.array(width=4).shape == (0, 4)
    want = np.arange(40 * 3, dtype=np.int32).reshape(40, 3)
    for row in want:  # past the first buffer of 16 rows, twice
        rows.append(row)
    out = rows.array()
    assert len(rows) == 40 and np.array_equal(out, want)
    out[0, 0] = -1  # a copy: the buffer keeps its rows
    assert rows.array()[0, 0] == 0
