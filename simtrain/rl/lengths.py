"""Response-length distributions for RL rollouts: parse a spec, sample lengths per prompt group.

A spec is a plain mapping, as it appears in YAML (the caller names where, e.g.
`rl.data.response_length`):

    {kind: fixed, tokens: 1024}
    {kind: lognormal, mean: 3000, sigma: 0.8, max: 8192}      # or median instead of mean
    {kind: empirical, values: [812, 1375, 2048]}               # observed lengths, with replacement
    {kind: empirical, centres: [256, 768], counts: [90, 10]}  # histogram: bin centres and counts
    {kind: empirical, edges: [0, 512, 1024], counts: [90, 10]}  # histogram: bin edges and counts
    {kind: empirical, file: lengths.csv}                       # any of the three, from a file
    {kind: mixture, components: [{weight: 0.9, kind: lognormal, ...}, {weight: 0.1, ...}]}

with, at the top level only, `max` (max_response_length: a longer generation is cut there; by
default 2**24, the largest length simtrain accepts), `min` (default 1) and `group_correlation`
(0..1, how much the n responses of one prompt share a difficulty).

The model. Each kind is a continuous or discrete random variable X (lognormal: ln X ~ N(mu,
sigma^2) with mu = ln median = ln mean - sigma^2/2; empirical values or centres: those atoms with
their frequencies; edges: uniform within each bin; mixture: component j with probability
w_j / sum(w)). A sampled length is K = clip(round(X), min, max), rounded to the nearest integer
(halves down). The responses of prompt i are drawn through a Gaussian copula:

    W_ij = sqrt(rho) Z_i + sqrt(1 - rho) E_ij,    Z_i, E_ij independent N(0, 1),
    X_ij = F^-1(Phi(W_ij))                         (F the CDF of X)

so every response keeps the marginal distribution whatever rho is, and the normal scores of two
responses of one prompt have correlation rho. For a lognormal this is exactly a shared log-normal
difficulty factor per prompt: X_ij = median * exp(sigma sqrt(rho) Z_i) * exp(sigma sqrt(1-rho) E_ij).
rho = 0 draws every response independently; rho = 1 gives every response of a prompt the same
length. See docs/modelling/response-lengths.md for the formulas and how to choose a distribution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from simtrain.errors import ConfigError, Problem, SimtrainError
from simtrain.spec.files import TreeError, decode_text, parse_yaml, read_bytes, short

MAX_TOKENS = 2 ** 24            # the largest response length accepted anywhere in a spec
MAX_FILE_BYTES = 64 * 2 ** 20   # a lengths file is read only up to this size
MAX_SIGMA = 5.0                 # lognormal sigma above this puts p99 over 10^5 x the median
MAX_COMPONENTS = 64
MAX_SAMPLES = 2 ** 28           # prompts x n per call
KINDS = ("fixed", "empirical", "lognormal", "mixture")
TOP_KEYS = ("max", "min", "group_correlation")
KIND_KEYS = {
    "fixed": ("tokens",),
    "lognormal": ("mean", "median", "sigma"),
    "empirical": ("values", "file", "centres", "edges", "counts"),
    "mixture": ("components",),
}
_STD = NormalDist()
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF, elementwise (math.erfc, so it stays exact in the far tails)."""
    # np.asarray: frompyfunc gives a bare Python float, not an array, for a 0-d input
    return 0.5 * np.asarray(_erfc(-np.asarray(x, dtype=float) / math.sqrt(2.0)), dtype=float)


# ---------------------------------------------------------------------------------------------
# the distributions (continuous X before rounding and clipping)


@dataclass(frozen=True)
class Fixed:
    tokens: int

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=float) >= self.tokens).astype(float)

    def from_normal(self, w: np.ndarray) -> np.ndarray:
        return np.full(w.shape, float(self.tokens))

    def clipped_mean(self, lo: float, hi: float) -> float:
        return float(min(max(self.tokens, lo), hi))

    def describe(self) -> str:
        return f"fixed {self.tokens} tokens"


@dataclass(frozen=True)
class LogNormal:
    """ln X ~ N(mu, sigma^2); `given` is the parameter the spec named ("mean" or "median")."""
    mu: float
    sigma: float
    given: str = "median"

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma ** 2 / 2)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(x, 0.0)) - self.mu) / self.sigma
        return _phi(z)

    def from_normal(self, w: np.ndarray) -> np.ndarray:
        return np.exp(self.mu + self.sigma * w)

    def clipped_mean(self, lo: float, hi: float) -> float:
        """E[clip(X, lo, hi)] = lo Phi(a) + e^(mu + s^2/2) (Phi(b - s) - Phi(a - s)) + hi (1 - Phi(b)),
        a = (ln lo - mu)/s, b = (ln hi - mu)/s (the integral of x over [lo, hi] under the lognormal
        density is e^(mu + s^2/2) times the N(mu + s^2, s^2) mass of [ln lo, ln hi])."""
        s, nd = self.sigma, _STD
        a = (math.log(lo) - self.mu) / s
        b = (math.log(hi) - self.mu) / s
        return lo * nd.cdf(a) + self.mean * (nd.cdf(b - s) - nd.cdf(a - s)) + hi * (1.0 - nd.cdf(b))

    def describe(self) -> str:
        p = f"mean {self.mean:.6g}" if self.given == "mean" else f"median {self.median:.6g}"
        return f"lognormal({p}, sigma {self.sigma:g})"


@dataclass(frozen=True, eq=False)
class Empirical:
    """Atoms (`values` or histogram `centres`) with probabilities, or histogram bins (`edges`)
    with a probability each, uniform within a bin. `cum` is the CDF at the atoms / the edges."""
    points: np.ndarray          # atoms (sorted, positive probability) or bin edges (increasing)
    cum: np.ndarray             # atoms: P(X <= points[i]); bins: P(X <= edges[i]), cum[0] = 0
    binned: bool
    source: str                 # for describe(): "12 values", "histogram of 40 bins from x.csv"

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self.binned:
            return np.interp(x, self.points, self.cum, left=0.0, right=1.0)
        i = np.searchsorted(self.points, x, side="right")
        return np.concatenate(([0.0], self.cum))[i]

    def from_normal(self, w: np.ndarray) -> np.ndarray:
        u = _phi(w)
        if self.binned:
            return np.interp(u, self.cum, self.points)
        i = np.minimum(np.searchsorted(self.cum, u, side="left"), len(self.points) - 1)
        return self.points[i]

    def clipped_mean(self, lo: float, hi: float) -> float:
        if not self.binned:
            p = np.diff(np.concatenate(([0.0], self.cum)))
            return float(np.dot(p, np.clip(self.points, lo, hi)))
        # E[clip(X, lo, hi)] = lo + integral over [lo, hi] of (1 - F(t)) dt; F is piecewise linear
        # between the edges, so the trapezoid rule on the edges inside [lo, hi] is exact
        inner = self.points[(self.points > lo) & (self.points < hi)]
        t = np.concatenate(([lo], inner, [hi]))
        s = 1.0 - self.cdf(t)
        return float(lo + np.sum((s[1:] + s[:-1]) / 2 * np.diff(t)))

    def describe(self) -> str:
        return f"empirical({self.source})"


@dataclass(frozen=True)
class Mixture:
    weights: tuple          # normalised to sum 1
    components: tuple

    def cdf(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(np.shape(x))
        for w, c in zip(self.weights, self.components):
            out = out + w * c.cdf(x)
        return out

    def clipped_mean(self, lo: float, hi: float) -> float:
        return float(sum(w * c.clipped_mean(lo, hi) for w, c in zip(self.weights, self.components)))

    def describe(self) -> str:
        return "mixture(" + ", ".join(f"{w:.4g} x {c.describe()}" for w, c in zip(self.weights, self.components)) + ")"


Dist = Fixed | LogNormal | Empirical | Mixture


# ---------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True)
class LengthSpec:
    """A response-length distribution with its limits. Lengths are integers in [min, hi], where
    hi = max, or MAX_TOKENS when no max is given."""
    dist: Dist
    min: int = 1
    max: int | None = None
    group_correlation: float = 0.0

    @property
    def hi(self) -> int:
        return self.max if self.max is not None else MAX_TOKENS

    def cdf(self, k: float | np.ndarray) -> np.ndarray | float:
        """P(length <= k) for integer k: F(k + 1/2) inside [min, hi) (rounding to nearest), 0 below
        min, 1 from hi up."""
        k = np.asarray(k, dtype=float)
        out = np.where(k >= self.hi, 1.0, np.where(k < self.min, 0.0, self.dist.cdf(np.floor(k) + 0.5)))
        return float(out) if out.ndim == 0 else out

    def mean(self) -> float:
        """E[clip(X, min, hi)] in closed form. A sampled length is that value rounded to an integer,
        so the mean of samples differs from this by at most half a token (clip between integers is
        1-Lipschitz and rounding moves a value by at most 1/2); for integer atoms it is exact."""
        return self.dist.clipped_mean(float(self.min), float(self.hi))

    def quantile(self, q: float) -> int:
        """The smallest length k in [min, hi] with P(length <= k) >= q, for q in [0, 1]."""
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or not 0 <= q <= 1:
            raise SimtrainError(f"quantile: {q!r} is not a probability; give a number in [0, 1], e.g. 0.99")
        return int(self._quantiles(np.array([float(q)]))[0])

    def _quantiles(self, u: np.ndarray) -> np.ndarray:
        """Vectorised bisection over the integers [min, hi] (at most 25 rounds, hi <= 2^24)."""
        lo = np.full(u.shape, self.min, dtype=np.int64)
        hi = np.full(u.shape, self.hi, dtype=np.int64)
        while True:
            active = lo < hi
            if not active.any():
                return lo
            mid = (lo + hi) // 2
            ge = self.dist.cdf(mid + 0.5) >= u
            hi = np.where(active & ge, mid, hi)
            lo = np.where(active & ~ge, mid + 1, lo)

    def describe(self) -> str:
        """E.g. "lognormal(mean 3000, sigma 0.8) truncated at 8192"."""
        out = self.dist.describe()
        if self.max is not None:
            out += f" truncated at {self.max}"
        if self.min != 1:
            out += f", at least {self.min}"
        if self.group_correlation:
            out += f", group correlation {self.group_correlation:g}"
        return out

    __str__ = describe

    def sample(self, prompts: int, n: int, rng: np.random.Generator) -> np.ndarray:
        return sample(self, prompts, n, rng)


def sample(spec: LengthSpec, prompts: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Response lengths for `prompts` prompts with `n` responses each: an int64 array of shape
    (prompts * n,), prompt by prompt (the n responses of prompt i are [i*n, (i+1)*n)), every value
    in [spec.min, spec.hi]. Draws prompts normals, then prompts x n normals, from `rng`, so the
    same seed gives the same array byte for byte."""
    for name, v in (("prompts", prompts), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= MAX_SAMPLES:
            raise SimtrainError(f"response lengths: {name}: {v!r} is not a whole number in 0..2^28; give a count such as 16")
    if prompts * n > MAX_SAMPLES:
        raise SimtrainError(f"response lengths: prompts x n = {prompts * n:,} is over 2^28 responses; sample fewer at a time")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator, e.g. numpy.random.default_rng(seed)")
    rho = spec.group_correlation
    z = rng.standard_normal(prompts)
    e = rng.standard_normal((prompts, n))
    w = (math.sqrt(rho) * z[:, None] + math.sqrt(1.0 - rho) * e).ravel()
    if isinstance(spec.dist, Mixture):
        return spec._quantiles(_phi(w))
    x = np.minimum(spec.dist.from_normal(w), float(spec.hi) + 1.0)
    return np.clip(np.ceil(x - 0.5), spec.min, spec.hi).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# choosing a lognormal from logged statistics


def lognormal_from(mean: float, p99: float, q: float = 0.99) -> dict:
    """The lognormal spec whose mean and q-quantile (default p99) are the given ones:
    with z = Phi^-1(q), ln(p99/mean) = z sigma - sigma^2/2, so sigma = z - sqrt(z^2 - 2 ln(p99/mean))
    (the smaller root; the larger, sigma > z, is an absurdly heavy tail). Needs
    mean < p99 <= mean e^(z^2/2) (14.97 x the mean for p99). Both are of the untruncated lengths:
    take them from logs whose clip fraction is below 1 - q, or use lognormal_from_clip."""
    for name, v in (("mean", mean), ("p99", p99)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_TOKENS:
            raise SimtrainError(f"lognormal_from: {name}: {v!r} is not a length in (0, 2^24]; give a token count")
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.5 < q < 1:
        raise SimtrainError(f"lognormal_from: q: {q!r} is not a probability in (0.5, 1); give e.g. 0.99")
    z = _STD.inv_cdf(q)
    r = math.log(p99 / mean)
    if r <= 0:
        raise SimtrainError(f"lognormal_from: p99: {p99:g} is not above the mean {mean:g}; a long-tailed length has its "
                            "upper quantile above its mean: check the two numbers")
    if 2 * r > z * z:
        raise SimtrainError(f"lognormal_from: p99: {p99:g} is {p99 / mean:.3g} x the mean, over the {math.exp(z * z / 2):.4g} x "
                            "any lognormal reaches; use a mixture with a long-tail component")
    sigma = z - math.sqrt(z * z - 2 * r)
    return {"kind": "lognormal", "mean": float(mean), "sigma": sigma}


def lognormal_from_clip(mean: float, clip_ratio: float, max: int, min: int = 1) -> dict:
    """The lognormal spec, truncated at `max`, whose mean after truncation is `mean` and whose
    fraction of responses cut at `max` is `clip_ratio`: what verl logs as response_length/mean
    and /clip_ratio. P(X > max) = c fixes mu = ln max - sigma z_c, z_c = Phi^-1(1 - c); the clipped
    mean then falls from max (sigma -> 0) to about c max (sigma -> inf), and sigma is found by
    bisection on it. Needs c max < mean < max."""
    if isinstance(max, bool) or not isinstance(max, int) or not 2 <= max <= MAX_TOKENS:
        raise SimtrainError(f"lognormal_from_clip: max: {max!r} is not a whole number in 2..2^24; give max_response_length")
    if isinstance(min, bool) or not isinstance(min, int) or not 1 <= min < max:
        raise SimtrainError(f"lognormal_from_clip: min: {min!r} is not a whole number in 1..max-1; give 1")
    c = clip_ratio
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 < c < 1:
        raise SimtrainError(f"lognormal_from_clip: clip_ratio: {c!r} is not a fraction in (0, 1); give the logged clip "
                            "fraction (a run with none clipped: use lognormal_from)")
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or not c * max < mean < max:
        raise SimtrainError(f"lognormal_from_clip: mean: {mean!r} is not between clip_ratio x max ({c * max:g}) and max "
                            f"({max}); a clipped mean lies there: check the numbers")
    zc = _STD.inv_cdf(1 - c)

    def clipped(s: float) -> float:
        return LogNormal(math.log(max) - s * zc, s).clipped_mean(float(min), float(max))

    lo, hi = 1e-6, MAX_SIGMA
    if clipped(hi) > mean or clipped(lo) < mean:
        raise SimtrainError(f"lognormal_from_clip: mean: {mean:g} with clip_ratio {c:g} needs sigma outside (0, {MAX_SIGMA:g}]; "
                            "use a mixture with a component at max")
    for _ in range(200):            # clipped() falls as sigma grows
        mid = (lo + hi) / 2
        if clipped(mid) > mean:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    s = (lo + hi) / 2
    return {"kind": "lognormal", "median": math.exp(math.log(max) - s * zc), "sigma": s, "max": max}


# ---------------------------------------------------------------------------------------------
# parsing


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Parser:
    def __init__(self, file: str, base_dir: Path):
        self.file = file
        self.base_dir = base_dir
        self.problems: list[Problem] = []

    def add(self, path: str, problem: str, fix: str, file: str | None = None) -> None:
        self.problems.append(Problem(file or self.file, path, problem, fix))

    # numbers -------------------------------------------------------------------------------

    def number(self, v: Any, path: str, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False,
               fix: str, file: str | None = None) -> float | int | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.add(path, f"{short(v, 60)} is not a number", fix, file)
            return None
        if not math.isfinite(v):
            self.add(path, f"{v} is not a finite number", fix, file)
            return None
        if integer and v != int(v):
            self.add(path, f"{v} is not a whole number of tokens", fix, file)
            return None
        if v < lo or (lo_open and v == lo) or v > hi:
            rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            what = "absurd (over 2^24 tokens)" if hi == MAX_TOKENS and v > hi else f"outside {rng}"
            self.add(path, f"{v:g} is {what}", fix, file)
            return None
        return int(v) if integer else float(v)

    def numbers(self, v: Any, path: str, *, allow_zero: bool, fix: str, file: str | None = None,
                what: str = "lengths") -> np.ndarray | None:
        """A non-empty list of finite numbers in [0 or >0, 2^24] (one problem for the first bad entry)."""
        if not isinstance(v, list):
            self.add(path, f"{short(v, 60)} is not a list", fix, file)
            return None
        if not v:
            self.add(path, "is an empty list", fix, file)
            return None
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or x > MAX_TOKENS \
                    or (x == 0 and not allow_zero):
                bound = "[0, 2^24]" if allow_zero else "(0, 2^24]"
                self.add(f"{path}[{i}]", f"{short(x, 60)} is not a finite number in {bound}", f"give {what} in {bound}", file)
                return None
        return np.asarray(v, dtype=float)

    # the spec --------------------------------------------------------------------------------

    def spec(self, tree: Any, path: str) -> LengthSpec | None:
        dist = self.dist(tree, path, top=True)
        if not isinstance(tree, dict):
            return None
        lo = 1
        if "min" in tree:
            lo = self.number(tree["min"], _join(path, "min"), 1, MAX_TOKENS, integer=True,
                             fix="give the shortest response in tokens, e.g. 1")
        hi = None
        if "max" in tree:
            hi = self.number(tree["max"], _join(path, "max"), 1, MAX_TOKENS, integer=True,
                             fix="give max_response_length in tokens, e.g. 8192")
            if hi is None:
                return None
        rho = 0.0
        if "group_correlation" in tree:
            rho = self.number(tree["group_correlation"], _join(path, "group_correlation"), 0, 1,
                              fix="give a number in [0, 1]: 0 independent responses, 1 one length per prompt")
        if lo is None or rho is None or dist is None:
            return None
        if hi is not None and hi < lo:
            self.add(_join(path, "max"), f"{hi} is below min {lo}", "raise max or lower min")
            return None
        if isinstance(dist, Fixed) and not lo <= dist.tokens <= (hi or MAX_TOKENS):
            self.add(_join(path, "tokens"), f"{dist.tokens} is outside [min {lo}, max {hi or MAX_TOKENS}]",
                     "give a length within the limits")
            return None
        return LengthSpec(dist, lo, hi, rho)

    def dist(self, tree: Any, path: str, top: bool) -> Dist | None:
        if not isinstance(tree, dict):
            self.add(path, f"{short(tree, 60)} is not a mapping", "give e.g. {kind: lognormal, mean: 3000, sigma: 0.8}")
            return None
        kind = tree.get("kind")
        if kind is None:
            self.add(_join(path, "kind"), "is missing", f"give one of {', '.join(KINDS)}")
            return None
        if kind not in KINDS:
            self.add(_join(path, "kind"), f"unknown kind {short(kind, 40)}", f"use one of {', '.join(KINDS)}")
            return None
        allowed = ("kind",) + KIND_KEYS[kind] + (TOP_KEYS if top else ("weight",))
        bad = False
        for key in tree:
            if key in allowed:
                continue
            bad = True
            if not top and key in TOP_KEYS:
                self.add(_join(path, str(key)), "is set on a mixture component", "set it once, on the mixture itself")
            else:
                self.add(_join(path, str(key)), f"unknown key for a {kind} length", f"allowed keys: {', '.join(allowed)}")
        if bad:
            return None
        return getattr(self, kind)(tree, path)

    def fixed(self, tree: dict, path: str) -> Fixed | None:
        if "tokens" not in tree:
            self.add(_join(path, "tokens"), "is missing", "give the response length in tokens, e.g. tokens: 1024")
            return None
        t = self.number(tree["tokens"], _join(path, "tokens"), 1, MAX_TOKENS, integer=True,
                        fix="give the response length in tokens, e.g. 1024")
        return None if t is None else Fixed(t)

    def lognormal(self, tree: dict, path: str) -> LogNormal | None:
        given = [k for k in ("mean", "median") if k in tree]
        if len(given) != 1:
            self.add(path, "needs exactly one of mean and median" + (" (both given)" if given else ""),
                     "give mean (of the untruncated lengths) or median, e.g. mean: 3000")
        if "sigma" not in tree:
            self.add(_join(path, "sigma"), "is missing", "give the standard deviation of ln(length), e.g. sigma: 0.8")
            return None
        s = self.number(tree["sigma"], _join(path, "sigma"), 0, MAX_SIGMA, lo_open=True,
                        fix=f"give the standard deviation of ln(length) in (0, {MAX_SIGMA:g}]; for one length use kind: fixed")
        if len(given) != 1:
            return None
        g = given[0]
        v = self.number(tree[g], _join(path, g), 0, MAX_TOKENS, lo_open=True, fix=f"give the {g} length in tokens, e.g. 3000")
        if s is None or v is None:
            return None
        mu = math.log(v) - (s * s / 2 if g == "mean" else 0.0)
        return LogNormal(mu, s, g)

    def mixture(self, tree: dict, path: str) -> Mixture | None:
        p = _join(path, "components")
        comps = tree.get("components")
        if not isinstance(comps, list) or not comps:
            self.add(p, "is missing or empty" if not comps else f"{short(comps, 60)} is not a list",
                     "give a list of {weight: w, kind: ...} entries")
            return None
        if len(comps) > MAX_COMPONENTS:
            self.add(p, f"has {len(comps)} components, over {MAX_COMPONENTS}", "merge components, or use an empirical histogram")
            return None
        weights, dists, ok = [], [], True
        for i, c in enumerate(comps):
            cp = f"{p}[{i}]"
            d = self.dist(c, cp, top=False)
            w = None
            if isinstance(c, dict):
                if "weight" not in c:
                    self.add(_join(cp, "weight"), "is missing", "give the component's share, e.g. weight: 0.1")
                else:
                    w = self.number(c["weight"], _join(cp, "weight"), 0, 1e12, fix="give a non-negative share, e.g. 0.1")
            ok = ok and d is not None and w is not None
            weights.append(w)
            dists.append(d)
        if not ok:
            return None
        total = sum(weights)
        if not total > 0:
            self.add(p, "weights sum to 0", "give at least one component a positive weight")
            return None
        keep = [(w / total, d) for w, d in zip(weights, dists) if w > 0]
        return Mixture(tuple(w for w, _ in keep), tuple(d for _, d in keep))

    def empirical(self, tree: dict, path: str) -> Empirical | None:
        sources = [k for k in ("values", "file", "centres", "edges") if k in tree]
        if len(sources) != 1:
            self.add(path, "needs exactly one of values, file, centres (with counts) and edges (with counts)"
                     + (f" ({', '.join(sources)} given)" if sources else ""),
                     "give e.g. values: [812, 1375, 2048] or file: lengths.csv")
            return None
        if sources[0] == "file":
            if "counts" in tree:
                self.add(_join(path, "counts"), "is given with file", "put the counts in the file")
                return None
            return self.from_file(tree["file"], _join(path, "file"))
        return self.tabulated(tree, path, None, "")

    def tabulated(self, tree: dict, path: str, file: str | None, origin: str) -> Empirical | None:
        """values / centres+counts / edges+counts of a mapping (inline or from a YAML file)."""
        if "values" in tree:
            if "counts" in tree:
                self.add(_join(path, "counts"), "is given with values", "drop counts (each value counts once), or use centres", file)
                return None
            v = self.numbers(tree["values"], _join(path, "values"), allow_zero=True, file=file,
                             fix="give observed response lengths, e.g. [812, 1375, 2048]")
            return None if v is None else atoms(v, np.ones(len(v)), f"{len(v)} values{origin}")
        key = "centres" if "centres" in tree else "edges"
        if key not in tree:
            self.add(path, "holds none of values, centres and edges", "give values: [...] or centres/edges with counts", file)
            return None
        pts = self.numbers(tree[key], _join(path, key), allow_zero=True, file=file, fix="give lengths in tokens")
        if "counts" not in tree:
            self.add(_join(path, "counts"), "is missing", f"give one count per {'centre' if key == 'centres' else 'bin'}", file)
            return None
        cnt = self.numbers(tree["counts"], _join(path, "counts"), allow_zero=True, file=file, what="counts",
                           fix="give non-negative counts")
        if pts is None or cnt is None:
            return None
        return self.histogram(key, pts, cnt, _join(path, "counts"), file, origin)

    def histogram(self, key: str, pts: np.ndarray, cnt: np.ndarray, path: str, file: str | None, origin: str) -> Empirical | None:
        need = len(pts) if key == "centres" else len(pts) - 1
        if len(cnt) != need:
            what = f"{len(pts)} centres" if key == "centres" else f"{len(pts)} edges ({need} bins)"
            self.add(path, f"has {len(cnt)} entries for {what}", "give one count per bin", file)
            return None
        if not cnt.sum() > 0:
            self.add(path, "sum to 0", "give at least one bin a positive count", file)
            return None
        if key == "centres":
            return atoms(pts, cnt, f"histogram of {len(pts)} bins{origin}")
        if np.any(np.diff(pts) <= 0):
            i = int(np.argmax(np.diff(pts) <= 0)) + 1
            self.add(path.rsplit(".", 1)[0] + f".edges[{i}]" if "." in path else f"edges[{i}]",
                     f"{pts[i]:g} is not above the edge before it ({pts[i - 1]:g})", "give increasing bin edges", file)
            return None
        cum = np.concatenate(([0.0], np.cumsum(cnt) / cnt.sum()))
        cum[-1] = 1.0
        return Empirical(pts, cum, True, f"histogram of {need} bins{origin}")

    def from_file(self, name: Any, path: str) -> Empirical | None:
        if not isinstance(name, str) or not name.strip():
            self.add(path, f"{short(name, 60)} is not a file name", "give a path, relative to the scenario's directory")
            return None
        fp = Path(name).expanduser()
        if not fp.is_absolute():
            fp = self.base_dir / fp
        try:
            text = decode_text(read_bytes(fp, MAX_FILE_BYTES))
        except TreeError as e:
            problem, _, own = str(e).partition("; ")
            self.add(path, f"{fp}: {problem}", own or "give a CSV or YAML file of lengths")
            return None
        origin = f" from {Path(name).name}"
        if fp.suffix.lower() in (".yaml", ".yml", ".json"):
            try:
                tree = parse_yaml(text)
            except TreeError as e:
                problem, _, own = str(e).partition("; ")
                self.add("", problem, own or "fix the file", str(fp))
                return None
            if isinstance(tree, list):
                tree = {"values": tree}
            if not isinstance(tree, dict):
                self.add("", "holds neither a list of lengths nor a mapping", "give values: [...] or centres/edges with counts", str(fp))
                return None
            extra = [k for k in tree if k not in ("values", "centres", "edges", "counts")]
            if extra:
                self.add(str(extra[0]), "unknown key in a lengths file", "allowed keys: values, centres, edges, counts", str(fp))
                return None
            return self.tabulated(tree, "", str(fp), origin)
        return self.csv(text, str(fp), origin)

    def csv(self, text: str, file: str, origin: str) -> Empirical | None:
        """One length per line (an optional header line), or a histogram with a header:
        `centre,count` (or center/length/tokens) or `lo,hi,count`. Blank and # lines are skipped."""
        rows, header, header_line = [], None, 0
        for ln, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            cells = [c.strip() for c in (line.split(",") if "," in line else line.split())]
            nums = []
            for c in cells:
                try:
                    nums.append(float(c))
                except ValueError:
                    nums = None
                    break
            if nums is None:
                if header is None and not rows:
                    header, header_line = [c.lower() for c in cells], ln
                    continue
                self.add(f"line {ln}", f"{short(line, 60)} is not a row of numbers", "give one number per column", file)
                return None
            rows.append((ln, nums))
        if not rows:
            self.add("", "holds no lengths", "give one length per line, or a histogram with a header", file)
            return None
        width = len(header) if header is not None else len(rows[0][1])
        for ln, nums in rows:
            if len(nums) != width:
                self.add(f"line {ln}", f"has {len(nums)} columns, not {width}", "give the same columns on every line", file)
                return None
        cols = np.asarray([r[1] for r in rows], dtype=float)
        bad = ~np.isfinite(cols) | (cols < 0) | (cols > np.where(np.arange(width) == width - 1, np.inf, MAX_TOKENS)
                                                 if width > 1 else cols > MAX_TOKENS)
        if bad.any():
            r = int(np.argmax(bad.any(axis=1)))
            self.add(f"line {rows[r][0]}", f"{short(rows[r][1], 60)} holds a value that is not a finite number in [0, 2^24]",
                     "give lengths (and counts) as non-negative finite numbers", file)
            return None
        if width == 1:
            return atoms(cols[:, 0], np.ones(len(cols)), f"{len(cols)} values{origin}")
        names = {2: ({"centre", "center", "length", "tokens"}, {"count"}), 3: ({"lo"}, {"hi"}, {"count"})}
        if width not in names or header is None or any(h not in ok for h, ok in zip(header, names[width])):
            self.add(f"line {header_line or rows[0][0]}", f"{width} columns need a header naming them",
                     "give `centre,count` (bin centres) or `lo,hi,count` (bin edges) as the first line", file)
            return None
        if width == 2:
            return self.histogram("centres", cols[:, 0], cols[:, 1], "counts", file, origin)
        lo, hi, cnt = cols[:, 0], cols[:, 1], cols[:, 2]
        gap = np.flatnonzero((hi <= lo) | np.concatenate((lo[1:] != hi[:-1], [False])))
        if len(gap):
            i = int(gap[0])
            self.add(f"line {rows[i][0]}", f"bin [{lo[i]:g}, {hi[i]:g}) is empty or does not end where the next begins",
                     "give contiguous bins, each hi above its lo and equal to the next lo", file)
            return None
        return self.histogram("edges", np.concatenate((lo, hi[-1:])), cnt, "counts", file, origin)


def atoms(values: np.ndarray, weights: np.ndarray, source: str) -> Empirical:
    """An empirical distribution putting weight on each value (equal values merged, zero weights dropped)."""
    keep = weights > 0
    pts, inv = np.unique(values[keep], return_inverse=True)
    w = np.bincount(inv, weights=weights[keep], minlength=len(pts))
    cum = np.cumsum(w) / w.sum()
    cum[-1] = 1.0
    return Empirical(pts, cum, False, source)


def parse_length_spec(tree: Any, path: str, *, file: str = "<spec>", base_dir: str | Path | None = None) -> LengthSpec:
    """The LengthSpec of a mapping found at key path `path` of `file`. A relative `file:` of an
    empirical spec is read from `base_dir` (the scenario's directory; the current directory when
    None). Every problem is reported at its key path (`<file>: <path>.sigma: ...; <fix>`) in one
    ConfigError (a SimtrainError); problems inside a lengths file name that file and line."""
    p = _Parser(file, Path(base_dir) if base_dir is not None else Path.cwd())
    spec = p.spec(tree, path)
    if p.problems:
        raise ConfigError(p.problems)
    assert spec is not None
    return spec
