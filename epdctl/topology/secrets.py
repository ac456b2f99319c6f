"""Is a value a secret? Decided by the value, never by the variable's name: SGLang's own tuning
variables are called ..._TOKENS_... or ..._KEY_... and hold numbers; a real key looks like one.

A value is a secret when it carries a known key prefix (OpenAI ``sk-``, Hugging Face ``hf_``,
GitHub ``ghp_``/``github_pat_``, GitLab ``glpat-``, Slack ``xox?-``, AWS ``AKIA``/``ASIA``, Google
``AIza``, a JWT ``eyJ...``) or is a long high-entropy token. Numbers, paths, URLs, host:port,
booleans, ``${VAR}`` references and hex digests (a model revision, a checksum: at most 4 bits per
character, below the threshold) never are.
"""

from __future__ import annotations

import math
import re
from collections import Counter

KEY_PREFIX = re.compile(r"^(sk-|sk_live_|sk_test_|rk_live_|hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|"
                        r"xox[abprs]-|AKIA|ASIA|AIza|eyJ[A-Za-z0-9_-]{8,}\.)")
TOKENISH = re.compile(r"^[A-Za-z0-9_\-+=/.]+$")
REF = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
MIN_LEN = 24
MIN_BITS = 4.0  # bits per character; English words and paths stay well below


def entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def looks_secret(value: str) -> bool:
    v = REF.sub("", value).strip()
    if not v or " " in v:
        return False
    try:
        float(v)
        return False  # numbers are never secrets
    except ValueError:
        pass
    if KEY_PREFIX.match(v) and len(v) >= 12:
        return True
    if len(v) < MIN_LEN or not TOKENISH.match(v) or "://" in v or v.count("/") > 1 or v.count(".") > 2:
        return False
    has_digit = any(c.isdigit() for c in v)
    has_alpha = any(c.isalpha() for c in v)
    return has_digit and has_alpha and entropy(v) >= MIN_BITS
