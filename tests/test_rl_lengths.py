"""Response-length distributions for RL rollouts: sampling statistics against closed forms, and
one clear error at the key path for every bad input."""
import math
from statistics import NormalDist

import numpy as np
import pytest

from simtrain.errors import SimtrainError
from simtrain.rl.lengths import lognormal_from, parse_length_spec, sample

P = "rl.data.response_length"
N01 = NormalDist()


def spec(tree, **kw):
    return parse_length_spec(tree, P, file="s.yaml", **kw)


def draw(tree, prompts=4000, n=5, seed=1):
    return sample(spec(tree), prompts, n, np.random.default_rng(seed))


def test_fixed_gives_the_constant():
    # a point mass at 1024: every draw is 1024 whatever the seed
    x = draw({"kind": "fixed", "tokens": 1024}, 10, 3)
    assert x.shape == (30,) and np.all(x == 1024)


@pytest.mark.parametrize("given", ["mean", "median"])
def test_lognormal_sample_mean(given):
    # ln X ~ N(mu, s^2): E X = exp(mu + s^2/2), Var X = (exp(s^2) - 1) exp(2 mu + s^2).
    # mean: 3000 gives mu = ln 3000 - s^2/2; median: 3000 gives mu = ln 3000.
    s, v = 0.5, 3000.0
    mu = math.log(v) - (s * s / 2 if given == "mean" else 0.0)
    mean = math.exp(mu + s * s / 2)
    sd = math.sqrt((math.exp(s * s) - 1) * math.exp(2 * mu + s * s))
    x = draw({"kind": "lognormal", given: v, "sigma": s}, 20000, 1)
    # rounding to integers shifts the mean by at most 1/2 token
    assert abs(x.mean() - mean) < 4 * sd / math.sqrt(len(x)) + 0.5


def test_truncation_clips_to_max_with_the_lognormal_tail_fraction():
    # median 3000, s 0.8, max 8192: P(X > 8192) = 1 - Phi((ln 8192 - ln 3000) / 0.8) = 0.1052;
    # a draw is at max iff round(X) >= 8192, i.e. X > 8191.5 (1 - Phi((ln 8191.5 - ln 3000)/0.8))
    x = draw({"kind": "lognormal", "median": 3000, "sigma": 0.8, "max": 8192}, 40000, 1)
    assert x.max() == 8192
    p = 1 - N01.cdf((math.log(8191.5) - math.log(3000)) / 0.8)
    assert abs(p - 0.1052) < 1e-3
    assert abs(np.mean(x == 8192) - p) < 4 * math.sqrt(p * (1 - p) / len(x))


def test_mixture_component_fractions():
    # weights 3 and 1 normalise to 0.75 / 0.25; two fixed components 100 and 5000 tell them apart
    x = draw({"kind": "mixture", "components": [
        {"weight": 3, "kind": "fixed", "tokens": 100}, {"weight": 1, "kind": "fixed", "tokens": 5000}]}, 40000, 1)
    assert set(np.unique(x)) == {100, 5000}
    assert abs(np.mean(x == 5000) - 0.25) < 4 * math.sqrt(0.25 * 0.75 / len(x))


def test_empirical_values_and_histogram_reproduce_their_mean():
    # values [812, 1375, 2048] with replacement: mean 4235/3 = 1411.67, population variance
    # sum((v - m)^2)/3 = 256,700; centres [256, 768] counts [90, 10]: mean 0.9*256 + 0.1*768 = 307.2
    x = draw({"kind": "empirical", "values": [812, 1375, 2048]}, 30000, 1)
    assert set(np.unique(x)) == {812, 1375, 2048}
    assert abs(x.mean() - 4235 / 3) < 4 * math.sqrt(256700 / len(x))
    h = draw({"kind": "empirical", "centres": [256, 768], "counts": [90, 10]}, 30000, 1)
    assert abs(h.mean() - 307.2) < 4 * 512 * math.sqrt(0.09 / len(h))
    # edges [0, 512, 1024] counts [90, 10], uniform within bins: mean 0.9*256 + 0.1*768 = 307.2,
    # plus the default min 1 lifting the mass 0.9/512 on [0, 1) (mean 1/2) to 1: + 0.9/512 * 1/2
    e = spec({"kind": "empirical", "edges": [0, 512, 1024], "counts": [90, 10]})
    assert abs(e.mean() - (307.2 + 0.9 / 512 / 2)) < 1e-9


def test_same_seed_same_array_other_seed_differs():
    t = {"kind": "lognormal", "mean": 2000, "sigma": 0.7, "max": 8192, "group_correlation": 0.3}
    assert np.array_equal(draw(t, 50, 4, seed=7), draw(t, 50, 4, seed=7))
    assert not np.array_equal(draw(t, 50, 4, seed=7), draw(t, 50, 4, seed=8))


def test_group_correlation_zero_and_one():
    base = {"kind": "lognormal", "median": 1000, "sigma": 0.6}
    # rho = 1: W_ij = Z_i for every j, so the n responses of a prompt are equal
    x1 = draw({**base, "group_correlation": 1}, 500, 8).reshape(500, 8)
    assert np.all(x1 == x1[:, :1])
    # rho = 0: responses independent, so E[within-group variance] = total variance
    # (ddof=1 within each group is unbiased for the marginal variance); 4000 groups of 8 leave ~2% noise
    x0 = np.log(draw({**base, "group_correlation": 0}, 4000, 8).reshape(4000, 8))
    within = x0.var(axis=1, ddof=1).mean()
    assert abs(within / x0.var() - 1) < 0.05


def test_lognormal_from_round_trips():
    # the returned lognormal has mean exp(mu + s^2/2) = 3000 and p99 exp(mu + z s) = 12000, z = Phi^-1(0.99)
    d = lognormal_from(3000, 12000)
    s = d["sigma"]
    mu = math.log(d["mean"]) - s * s / 2
    assert math.isclose(math.exp(mu + s * s / 2), 3000, rel_tol=1e-12)
    assert math.isclose(math.exp(mu + N01.inv_cdf(0.99) * s), 12000, rel_tol=1e-9)
    assert spec(d).quantile(0.99) in (11999, 12000)   # integer lengths, rounding to nearest


@pytest.mark.parametrize("tree,key", [
    ({"kind": "gamma"}, f"{P}.kind"),
    ({"kind": "lognormal", "mean": float("nan"), "sigma": 0.5}, f"{P}.mean"),
    ({"kind": "lognormal", "mean": 3000, "sigma": float("inf")}, f"{P}.sigma"),
    ({"kind": "fixed", "tokens": -5}, f"{P}.tokens"),
    ({"kind": "fixed", "tokens": 2 ** 24 + 1}, f"{P}.tokens"),
    ({"kind": "lognormal", "mean": 3000, "sigma": 0.5, "max": 2 ** 25}, f"{P}.max"),
    ({"kind": "empirical", "values": []}, f"{P}.values"),
    ({"kind": "empirical", "values": [100, float("nan")]}, f"{P}.values[1]"),
    ({"kind": "mixture", "components": [{"weight": 0, "kind": "fixed", "tokens": 9}]}, f"{P}.components"),
    ({"kind": "empirical", "file": "no-such-lengths.csv"}, f"{P}.file"),
    ({"kind": "fixed", "tokens": "1024"}, f"{P}.tokens"),
    ({"kind": "lognormal", "mean": 3000, "sigma": 0.5, "group_correlation": 1.5}, f"{P}.group_correlation"),
    ("lognormal", P),
])
def test_bad_inputs_name_the_key(tree, key, tmp_path):
    with pytest.raises(SimtrainError) as e:
        spec(tree, base_dir=tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"s.yaml: {key}:"), msg
    assert "; " in msg and "\n" not in msg


def test_lengths_file_read_and_too_large(tmp_path, monkeypatch):
    # a CSV of one length per line is an empirical list: mean (100 + 300) / 2 = 200
    (tmp_path / "l.csv").write_text("tokens\n100\n300\n")
    assert spec({"kind": "empirical", "file": "l.csv"}, base_dir=tmp_path).mean() == 200
    import simtrain.rl.lengths as lengths
    monkeypatch.setattr(lengths, "MAX_FILE_BYTES", 8)
    with pytest.raises(SimtrainError) as e:
        spec({"kind": "empirical", "file": "l.csv"}, base_dir=tmp_path)
    assert str(e.value).startswith(f"s.yaml: {P}.file:"), str(e.value)


def test_cdf_of_a_single_length():
    # median 3000, s 0.8, max 8192: P(length <= 8191) = Phi((ln 8191.5 - ln 3000) / 0.8) (round to
    # nearest, so X < 8191.5), and P(length <= 8192) = 1 (everything above is cut to 8192)
    s = spec({"kind": "lognormal", "median": 3000, "sigma": 0.8, "max": 8192})
    assert math.isclose(s.cdf(8191), N01.cdf((math.log(8191.5) - math.log(3000)) / 0.8), rel_tol=1e-12)
    assert s.cdf(8192) == 1.0 and s.cdf(0) == 0.0
