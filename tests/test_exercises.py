import pytest

from labkit.exercises._core import check, same


def ref(x, y):
    return x + y


def test_pass_line(capsys):
    assert check("add", lambda x, y: x + y, ref, [(1, 2), (3, 4)])
    assert "[PASS] add: all 2 cases" in capsys.readouterr().out


def test_failure_names_case_expected_and_got(capsys):
    assert not check("add", lambda x, y: x + y if x < 3 else 0, ref, [(1, 2), (3, 4)], hint="add them")
    out = capsys.readouterr().out
    assert "case 2/2" in out and "expected: 7" in out and "got:      0" in out and "hint: add them" in out


def test_not_implemented_is_a_todo(capsys):
    def stub(x, y):
        raise NotImplementedError

    assert not check("add", stub, ref, [(1, 2)])
    assert "[TODO] add" in capsys.readouterr().out


def test_exception_is_reported_not_raised(capsys):
    assert not check("add", lambda x, y: x / 0, ref, [(1, 2)])
    assert "raised ZeroDivisionError" in capsys.readouterr().out


def test_mutating_the_input_does_not_corrupt_the_reference(capsys):
    def sneaky(xs):
        xs.append(99)
        return sum(xs)

    assert not check("sum", sneaky, sum, [([1, 2],)])


def test_same_handles_tensors_arrays_floats():
    import numpy as np
    import torch

    assert same(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-8]))
    assert not same(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]))
    assert not same(torch.tensor([1, 2]), [1, 2])
    assert same(np.array([1.0]), np.array([1.0]))
    assert same(0.1 + 0.2, 0.3) and not same(0.1, 0.2)
    assert same({"a": [1, 2.0]}, {"a": [1, 2.0]}) and not same({"a": 1}, {"b": 1})


def test_non_callable_is_a_type_error():
    with pytest.raises(TypeError):
        check("x", 3, ref, [(1, 2)])


def test_welcome_checker_catches_a_wrong_formula(capsys):
    from labkit.exercises import check_decode_tokens_per_s

    def right(n, bits, group, bw):
        return bw * 1e9 / (n * (bits + (16 / group if group else 0)) / 8)

    assert check_decode_tokens_per_s(right)
    assert not check_decode_tokens_per_s(lambda n, bits, group, bw: bw * 1e9 / (n * bits / 8))  # no scales
    assert not check_decode_tokens_per_s(lambda n, bits, group, bw: bw * 1e9 / (n * bits))      # bits as bytes
    assert not check_decode_tokens_per_s(                                                      # a scale per weight
        lambda n, bits, group, bw: bw * 1e9 / (n * (bits + (16 if group else 0)) / 8))


def test_largest_model_checker_needs_both_limits(capsys):
    from labkit.exercises import check_largest_model

    assert check_largest_model(lambda t, b, bw, mem: min(bw * 1e9 / t / b, mem * 1e9 / b))
    assert not check_largest_model(lambda t, b, bw, mem: bw * 1e9 / t / b)  # forgets that the model must fit
    assert not check_largest_model(lambda t, b, bw, mem: mem * 1e9 / b)  # forgets the speed


def test_the_bound_with_the_cache_checker_needs_the_cache(capsys):
    from labkit.exercises import check_decode_tokens_per_s_at

    right = lambda n, b, kv, ctx, bw: bw * 1e9 / (n * b + ctx * kv)
    assert check_decode_tokens_per_s_at(right)
    assert not check_decode_tokens_per_s_at(lambda n, b, kv, ctx, bw: bw * 1e9 / (n * b))  # the cache left out
    assert not check_decode_tokens_per_s_at(lambda n, b, kv, ctx, bw: bw * 1e9 / (n * b + kv))  # one token's KV
    assert not check_decode_tokens_per_s_at(lambda n, b, kv, ctx, bw: bw * 1e9 / (n * b) - ctx * kv / 1e9)
