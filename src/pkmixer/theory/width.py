"""The fixed-Ω width and sparsity calculus (Hayase & Karakida Sec. 4.1 Eqs. 13-15; App. C.2, C.4, D.1, D.3).

Ω is the average number of connections (non-zero weights) per hidden layer of the effective MLP:

* SW-MLP (Eq. 13):     Ω = γ p m²,  so m = √(Ω/(γp)) for a density p (S.43);
* MLP-Mixer (Eq. 14):  Ω = γ (C S² + C² S)/2, effective width m = S·C (S-Mixer: γ = 1), so
  S = (√(C² + 8Ω/(γC)) − C)/2 for given C. m(C) has one peak, at C* = S* = (Ω/γ)^{1/3} with
  m = (Ω/γ)^{2/3} (Eq. 15), where the density p = Ω/(γm²) is smallest;
* bounds (S.45): (√(1 + 8Ω/γ) − 1)/2 ≤ m ≤ (Ω/γ)^{2/3}; the lower bound is reached at C = 1 or S = 1;
* fixed m instead of fixed γ (S.46): γ = 2Ω/(m(C + m/C)), largest at C* = S* = √m, where γ = Ω/(m√m).

Integer sizes are rounded to the nearest integer (halves up). For an integer pair (C, S) the density that
Eq. 13 gives with the pair's own Ω is Ω/(γm²) = (1/C + 1/S)/2, the mean density of the token-mixing (1/C)
and channel-mixing (1/S) layers, and that is the ``p`` reported for Mixer rows.
"""
from __future__ import annotations

import ast
import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError, check_density, check_positive, check_positive_int

# larger Ω are refused, expressions while they are evaluated (which also guards against 9**9**9); so is a larger
# Ω/γ, which sets every size below: C* = (Ω/γ)^(1/3) ≤ 1e10, widths up to MAX_WIDTH = (Ω/γ)^(2/3) ≤ 1e20
MAX_OMEGA = 1e30
MAX_WIDTH = 1e20
MAX_EXPRESSION_LENGTH = 200
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _nearest_int(x: float) -> int:
    return math.floor(x + 0.5)


def parse_omega(expr: str | int | float) -> int | float:
    """Ω from a number or an arithmetic expression such as ``"2**18"`` or ``"3*2**20"``.

    Only numbers, + - * / ** and parentheses are accepted (parsed with :mod:`ast`, never evaluated as code).
    An integral result is returned as ``int``. Raises ConfigError for anything else or a non-positive Ω.
    """
    if isinstance(expr, bool):
        raise ConfigError(f"Ω must be a positive number, got {expr!r}")
    if isinstance(expr, (int, float)):
        value = expr
    elif isinstance(expr, str):
        value = _evaluate(expr)
    else:
        raise ConfigError(f"Ω must be a number or an arithmetic expression, got {expr!r}")
    if not 0 < value <= MAX_OMEGA:
        raise ConfigError(f"Ω must be positive and at most 1e30, got {expr!r}")
    return int(value) if float(value).is_integer() else float(value)


def _evaluate(text: str) -> int | float:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"bad Ω expression {text!r}: {why}; use numbers, + - * / ** and parentheses")

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            value = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            value = _UNARY[type(node.op)](ev(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 128 or (left == 0 and right < 0)):
                raise bad(f"exponent {right!r} out of range")
            if isinstance(node.op, ast.Div) and right == 0:
                raise bad("division by zero")
            try:
                value = _BINARY[type(node.op)](left, right)
            except OverflowError:
                raise bad("too large") from None
        else:
            raise bad(f"{ast.unparse(node)!r} is not allowed")
        if isinstance(value, complex) or abs(value) > MAX_OMEGA:
            raise bad("not a real number below 1e30")
        return value

    if len(text) > MAX_EXPRESSION_LENGTH:  # also keeps the nesting, hence the recursion, shallow
        raise bad(f"longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: null bytes in the text
        raise bad("not an arithmetic expression") from None
    return ev(tree.body)


def _omega(value: str | int | float) -> float:
    return float(parse_omega(value))


def _gamma(value: object) -> float:
    return check_positive("γ (gamma)", value)


def _omega_gamma(omega: str | int | float, gamma: object) -> tuple[float, float]:
    """(Ω, γ), refused (ConfigError) when Ω/γ exceeds :data:`MAX_OMEGA`: its Mixer widths (Ω/γ)^(2/3) would
    be beyond :data:`MAX_WIDTH`, and their squares beyond what floats hold, before γ is as small as 1e-300."""
    omega, gamma = _omega(omega), _gamma(gamma)
    if omega / gamma > MAX_OMEGA:
        raise ConfigError(f"Ω/γ = {omega / gamma:.3g} is beyond {MAX_OMEGA:.0e} (Ω={omega:g}, γ={gamma:g}): its "
                          f"widths would exceed {MAX_WIDTH:.0e}; raise γ or lower Ω")
    return omega, gamma


def _size(name: str, value: object) -> int:
    """A positive integer size no larger than :data:`MAX_WIDTH`."""
    check_positive_int(name, value)
    if value > MAX_WIDTH:
        raise ConfigError(f"{name}={value} is beyond {MAX_WIDTH:.0e}, the largest width at any Ω")
    return value


# ---- the Mixer at fixed Ω --------------------------------------------------------------------------------


def mixer_omega(C: int, S: int, gamma: float = 1.0) -> float:
    """Ω = γ (C S² + C² S)/2 of an MLP-Mixer (Eq. 14; S-Mixer: γ = 1)."""
    _size("C", C)
    _size("S", S)
    return _gamma(gamma) * (C * S * S + C * C * S) / 2


def _exact_tokens(omega: float, C: float, gamma: float) -> float:
    return (math.sqrt(C * C + 8 * omega / (gamma * C)) - C) / 2


def mixer_width(omega: str | int | float, C: float, gamma: float = 1.0) -> float:
    """The effective width m(C) = C·S(C) with the exact, unrounded S (the curve of Fig. 3)."""
    C = check_positive("C", C)
    if C > MAX_WIDTH:
        raise ConfigError(f"C={C:g} is beyond {MAX_WIDTH:.0e}, the largest width at any Ω")
    omega, gamma = _omega_gamma(omega, gamma)
    return C * _exact_tokens(omega, C, gamma)


def tokens_for_channels(omega: str | int | float, C: int, gamma: float = 1.0) -> int:
    """S = (√(C² + 8Ω/(γC)) − C)/2 rounded to the nearest integer (Sec. 4.1). ConfigError if it rounds to 0."""
    _size("C", C)
    omega, gamma = _omega_gamma(omega, gamma)
    S = _nearest_int(_exact_tokens(omega, C, gamma))
    if S < 1:
        raise ConfigError(f"C={C} is too large for Ω={omega:g}, γ={gamma:g}: S would round to 0")
    return S


def width_bounds(omega: str | int | float, gamma: float = 1.0) -> tuple[float, float]:
    """(lower, upper) bounds of a Mixer's effective width at fixed Ω (S.45)."""
    omega, gamma = _omega_gamma(omega, gamma)
    ratio = omega / gamma
    return (math.sqrt(1 + 8 * ratio) - 1) / 2, ratio ** (2 / 3)


def optimal_channels(omega: str | int | float, gamma: float = 1.0) -> float:
    """C* = S* = (Ω/γ)^{1/3}, where m = S·C is largest (Eq. 15)."""
    omega, gamma = _omega_gamma(omega, gamma)
    return (omega / gamma) ** (1 / 3)


def symmetric_pairs(omega: str | int | float, gamma: float = 1.0, channels: Sequence[int] | None = None,
                    count: int | None = None, c_min: int = 16) -> list[tuple[int, int]]:
    """(C, S(C)) pairs at fixed Ω, sorted by C (App. C.2, C.4).

    Give either ``channels`` (the C values; one pair each) or ``count``: then ``count`` C values are spread
    geometrically over [c_min, C*) (the first ``count`` of ``count + 1`` points from c_min to C*, rounded)
    and every pair (a, b) is mirrored to (b, a), giving ``2·count`` pairs. The paper's Ω = 2^21 list is
    ``count=3, c_min=16`` and its Ω = 2^27 list ``count=2, c_min=128``; its Ω = 2^18 list uses C = 16, 32, 48
    (multiples of 16, not geometric), so pass those C values and their S values as ``channels``.
    """
    omega, gamma = _omega_gamma(omega, gamma)
    if (channels is None) == (count is None):
        raise ConfigError("give exactly one of channels (a list of C) or count (C values below C*)")
    if channels is not None:
        if len(channels) == 0:
            raise ConfigError("channels must list at least one C")
        return sorted((C, tokens_for_channels(omega, C, gamma)) for C in channels)
    check_positive_int("count", count)
    check_positive_int("c_min", c_min)
    c_star = optimal_channels(omega, gamma)
    if c_min >= c_star:
        raise ConfigError(f"c_min={c_min} must be below C* = {c_star:.4g} for Ω={omega:g}, γ={gamma:g}")
    below = sorted({_nearest_int(c) for c in np.geomspace(c_min, c_star, count + 1)[:-1]})
    if len(below) < count:
        raise ConfigError(f"cannot choose {count} distinct C values in [{c_min}, {c_star:.4g}); "
                          f"lower c_min or count")
    pairs = {(C, tokens_for_channels(omega, C, gamma)) for C in below}
    return sorted(pairs | {(S, C) for C, S in pairs})


# ---- the SW-MLP at fixed Ω, and γ at fixed m ------------------------------------------------------------


def swmlp_width(omega: str | int | float, density: float, gamma: float = 1.0) -> int:
    """m = √(Ω/(γp)) rounded to the nearest integer (Eq. 13, S.43); ConfigError beyond :data:`MAX_WIDTH`."""
    p = check_density("density p", density)
    omega, gamma = _omega_gamma(omega, gamma)
    m = math.sqrt(omega / gamma / p)
    if m > MAX_WIDTH:
        raise ConfigError(f"density p={p:g} at Ω={omega:g}, γ={gamma:g} gives an SW-MLP width m = √(Ω/(γp)) = "
                          f"{m:.3g}, beyond {MAX_WIDTH:.0e}; raise p")
    return max(1, _nearest_int(m))


def gamma_at_width(omega: str | int | float, m: int, C: float) -> float:
    """γ = 2Ω/(m(C + m/C)) of a Mixer with S·C = m fixed (App. D.3)."""
    _size("m", m)
    C = check_positive("C", C)
    return 2 * _omega(omega) / (m * (C + m / C))


def max_gamma_at_width(omega: str | int | float, m: int) -> tuple[float, float]:
    """(C*, γ_max) = (√m, Ω/(m√m)): the channels at which γ at fixed m peaks, and that peak (S.46)."""
    _size("m", m)
    return math.sqrt(m), _omega(omega) / (m * math.sqrt(m))


# ---- what the command line prints ------------------------------------------------------------------------


@dataclass(frozen=True)
class WidthSummary:
    """The optimum of Eq. 15 and the bounds of S.45 at fixed Ω and γ.

    ``c_star``/``m_max``/``p_min`` are the real-valued optimum; ``C``/``S``/``m`` the nearest integer pair
    (C = round(C*), S = S(C)); ``swmlp_dense_width`` = √(Ω/γ), the SW-MLP width at p = 1 (its only bound).
    """

    omega: float
    gamma: float
    c_star: float
    m_max: float
    p_min: float
    C: int
    S: int
    m: int
    m_lower: float
    m_upper: float
    swmlp_dense_width: float

    def as_dict(self) -> dict:
        return asdict(self)


def width_summary(omega: str | int | float, gamma: float = 1.0) -> WidthSummary:
    """The Mixer's widest point at fixed Ω (Eq. 15), its density, and the width bounds (S.45)."""
    omega, gamma = _omega_gamma(omega, gamma)
    c_star = optimal_channels(omega, gamma)
    m_max = (omega / gamma) ** (2 / 3)
    C = max(1, _nearest_int(c_star))
    S = tokens_for_channels(omega, C, gamma)
    lower, upper = width_bounds(omega, gamma)
    return WidthSummary(omega=omega, gamma=gamma, c_star=c_star, m_max=m_max, p_min=omega / (gamma * m_max ** 2),
                        C=C, S=S, m=C * S, m_lower=lower, m_upper=upper,
                        swmlp_dense_width=math.sqrt(omega / gamma))


def _mixer_row(C: int, S: int, gamma: float) -> dict:
    return {"kind": "mixer", "C": C, "S": S, "m": C * S, "gamma": gamma, "p": (1 / C + 1 / S) / 2,
            "omega": mixer_omega(C, S, gamma)}


def width_table(omega: str | int | float, gamma: float = 1.0, channels: Sequence[int] | None = None,
                count: int | None = None, densities: Sequence[float] | None = None, c_min: int = 16) -> list[dict]:
    """Rows of Mixer pairs and SW-MLP widths at fixed Ω, each with the keys kind, C, S, m, gamma, p, omega.

    Mixer rows (``kind="mixer"``) come from :func:`symmetric_pairs` (``channels`` or ``count``, ``c_min``);
    their ``p`` is Ω/(γm²) of Eq. 13 with the pair's own Ω (``omega``), which equals (1/C + 1/S)/2. SW-MLP
    rows (``kind="swmlp"``, C = S = None) give m = √(Ω/(γp)) for each density in ``densities`` (S.43) and
    ``omega`` = γ p m². With none of channels, count and densities, the table is ``count=3``.
    """
    omega, gamma = _omega_gamma(omega, gamma)
    if channels is None and count is None and densities is None:
        count = 3
    rows = []
    if channels is not None or count is not None:
        rows += [_mixer_row(C, S, gamma) for C, S in symmetric_pairs(omega, gamma, channels, count, c_min)]
    for p in densities or ():
        m = swmlp_width(omega, p, gamma)
        rows.append({"kind": "swmlp", "C": None, "S": None, "m": m, "gamma": gamma, "p": float(p),
                     "omega": gamma * p * m * m})
    return rows


def fixed_width_table(omega: str | int | float, m: int, channels: Sequence[int] | None = None) -> list[dict]:
    """Rows C, S = m/C, gamma (S.46) of Mixers with S·C = m at fixed Ω; ``channels`` defaults to every divisor
    of m. ConfigError if a C does not divide m."""
    omega = _omega(omega)
    _size("m", m)
    if channels is None:
        channels = [C for C in range(1, math.isqrt(m) + 1) if m % C == 0]
        channels = sorted(set(channels) | {m // C for C in channels})
    rows = []
    for C in channels:
        check_positive_int("C", C)
        if m % C:
            raise ConfigError(f"C={C} does not divide m={m}")
        rows.append({"C": C, "S": m // C, "m": m, "gamma": gamma_at_width(omega, m, C)})
    return rows
