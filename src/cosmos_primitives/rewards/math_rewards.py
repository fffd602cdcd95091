"""cosmos-rl's math rewards under cosmos-rl's names: ``boxed_math``, ``direct_math``, ``gsm8k``.

A cosmos-rl config's ``reward_function = "boxed_math"`` (or ``direct_math`` / ``gsm8k``) scores as it
did there:

- ``boxed_math``: 1.0 iff Hugging Face's ``math_verify`` finds the completion's answer (a ``\\boxed{}``,
  LaTeX or a plain expression) mathematically equal to the reference's LaTeX answer (``$...$`` or
  ``\\boxed{...}``), else 0.0; 0.0 when either side has no answer ``math_verify`` can extract (a
  reference written as a bare ``19`` never matches, as in cosmos-rl). Needs the ``math`` extra.
- ``direct_math``: the last ``Answer: ...`` line of the completion, normalised (units, ``\\text{}``,
  ``\\boxed{}``, ``$`` and spaces dropped, shorthand ``\\frac`` / ``\\sqrt`` expanded), equal as a string
  to the reference: 1.0, else -1.0.
- ``gsm8k``: the number after ``#### `` in the completion equals the one in the reference (GSM8K's
  answer layout; commas and ``$`` dropped): 1.0, else 0.0 (also when either has none).
"""

from __future__ import annotations

import functools
import logging
import re
import threading

from cosmos_primitives.rewards.registry import register_reward
from cosmos_primitives.utils.extras import require

log = logging.getLogger(__name__)

# direct_math's normalisation (the quantitative-reasoning answer normaliser cosmos-rl uses)
_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_UNITS = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
          "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
          "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
          "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
          r",\!", "{,}", '"', "\\dots")
_DIRECT_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def normalize_final_answer(answer: str) -> str:
    """``direct_math``'s normal form of an answer string: the text after the last ``=``, without
    units, ``\\text{}`` / ``\\textbf{}`` / ``\\overline{}`` / ``\\boxed{}`` wrappers, ``$`` and spaces;
    ``\\fracab`` -> ``\\frac{a}{b}``, ``\\sqrta`` -> ``\\sqrt{a}``; ``1,000`` -> ``1000``."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for unit in _UNITS:
        answer = answer.replace(unit, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    for wrapper in ("text", "textbf", "overline"):
        answer = re.sub(rf"(\\{wrapper}\{{)(.*?)(\}})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


@functools.cache
def _warn_unreadable_reference(reference: str) -> None:
    log.warning(f"boxed_math: no LaTeX answer in the reference {reference[:80]!r}, so it scores 0.0 (as in "
                "cosmos-rl); write references as '$...$' or '\\boxed{...}'")


class _OffMainThreadTimeoutNotice(logging.Filter):
    """Drops math_verify's "Timeout is disabled" warning for calls boxed_math makes without a time limit
    on purpose (off the main thread); :func:`_warn_no_time_limit` says it once, with the reason."""

    def __init__(self) -> None:
        super().__init__()
        self.active = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(self.active, "on", False) and str(record.msg).startswith("Timeout is disabled"))


_TIMEOUT_NOTICE = _OffMainThreadTimeoutNotice()


@functools.cache
def _quiet_math_verify_timeout_notice() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_TIMEOUT_NOTICE)


@functools.cache
def _warn_no_time_limit() -> None:
    log.warning(f"boxed_math runs off the main thread (thread {threading.current_thread().name!r}): math_verify "
                "bounds its sympy work with SIGALRM, which only the main thread may set, so boxed_math calls off "
                "the main thread have no time limit (said once per process)")


@register_reward("boxed_math")
def boxed_math_reward(completion: str, reference: str | None) -> float:
    """cosmos-rl's ``boxed_math``: 1.0 iff ``math_verify`` finds the completion's answer (expression or
    LaTeX) equal, to 6 decimals, to the reference's LaTeX answer; else 0.0 (also when no answer can be
    extracted from either, or math_verify fails).

    Raises:
        MissingExtraError: ``math_verify`` is not installed (``pip install 'cosmos_primitives[math]'``).
    """
    math_verify = require("math_verify", "the boxed_math reward")
    if reference is None:
        return 0.0
    # math_verify bounds its sympy work with SIGALRM, which only the main thread may set; elsewhere
    # (a reward server's or event loop's helper thread) it would raise, so it runs unbounded there
    on_main = threading.current_thread() is threading.main_thread()
    limit = 5 if on_main else None
    if not on_main:
        _quiet_math_verify_timeout_notice()
        _warn_no_time_limit()
    _TIMEOUT_NOTICE.active.on = not on_main
    try:
        gold = math_verify.parse(reference, (math_verify.LatexExtractionConfig(),), parsing_timeout=limit)
        if not gold:
            _warn_unreadable_reference(reference)
            return 0.0
        answer = math_verify.parse(completion, (math_verify.ExprExtractionConfig(),
                                                math_verify.LatexExtractionConfig()), parsing_timeout=limit)
        return 1.0 if answer and math_verify.verify(gold, answer, 6, timeout_seconds=limit) else 0.0
    except Exception:  # math_verify's timeouts and parser failures score 0, as in cosmos-rl
        return 0.0
    finally:
        _TIMEOUT_NOTICE.active.on = False


@register_reward("direct_math")
def direct_math_reward(completion: str, reference: str | None) -> float:
    """cosmos-rl's ``direct_math``: 1.0 iff the completion's last ``Answer: ...`` (case-insensitive),
    normalised by :func:`normalize_final_answer`, equals the reference string; else -1.0."""
    found = _DIRECT_ANSWER.findall(completion)
    answer = normalize_final_answer(found[-1] if found else "[INVALID]")
    return 1.0 if answer == reference else -1.0


def _gsm8k_number(text: str) -> str | None:
    match = _GSM8K_ANSWER.search(text)
    return None if match is None else match.group(1).replace(",", "").replace("$", "")


@register_reward("gsm8k")
def gsm8k_reward(completion: str, reference: str | None) -> float:
    """cosmos-rl's ``gsm8k``: 1.0 iff the completion's first ``#### <number>`` equals the reference's
    (commas and ``$`` dropped), else 0.0; 0.0 when the completion has none (cosmos-rl also gives 1.0
    when neither has one)."""
    answer = _gsm8k_number(completion)
    return 1.0 if answer is not None and answer == _gsm8k_number(reference or "") else 0.0
