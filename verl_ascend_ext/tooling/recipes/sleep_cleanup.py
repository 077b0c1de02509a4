"""Recipe check: whether a recipe runs vLLM-Ascend with its extra clean-up after sleep
(``additional_config.enable_sleep_mode_extra_cleanup``, off by default; vllm-ascend #9585: 3.2 -> 0.7 GiB kept after
sleep with expert parallel, 1.26 -> 0.72 GiB without)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from verl_ascend_ext.features.sleep_memory.series import CLEANUP_KEY, CLEANUP_OVERRIDE
from verl_ascend_ext.runtime.findings import INFO, OK, WARN, Finding
from verl_ascend_ext.tooling.recipes.manifest import Manifest

SUBJECT = "sleep clean-up"
SECTION = "rollout"
RELEASES_WITH_IT = ("0.23.0", "0.23.0.post1", "0.26.0rc1")  # read in their released ascend_config.py


def pinned_release_has_it(manifest: Manifest) -> bool | None:
    """Whether the manifest's vLLM-Ascend pin admits a release known to have the clean-up (None: no vLLM-Ascend)."""
    pin = next((p for p in manifest.packages if p.distribution == "vllm-ascend"), None)
    if pin is None:
        return None
    try:
        spec = SpecifierSet(pin.version or "")
    except InvalidSpecifier:
        return False
    return any(spec.contains(release, prereleases=True) for release in RELEASES_WITH_IT)


def sleep_cleanup_findings(config: Any, setters: Mapping[str, Any], manifest: Manifest) -> list[Finding]:
    """On (ok), off (warn, with the override that set it off and the fix), or not a setting of the pinned release."""
    from omegaconf import OmegaConf

    has = pinned_release_has_it(manifest)
    if has is None:
        return []
    if not has:
        return [Finding(SECTION, SUBJECT, INFO, "the pinned vLLM-Ascend is none of the releases known to have "
                        f"enable_sleep_mode_extra_cleanup ({', '.join(RELEASES_WITH_IT)}): not checked")]
    value = OmegaConf.select(config, CLEANUP_KEY, default=None)
    setter = setters.get(CLEANUP_KEY)
    text, source = getattr(setter, "text", None), getattr(setter, "source", None)
    if value is True:
        return [Finding(SECTION, SUBJECT, OK, "vLLM-Ascend's extra clean-up after sleep is on "
                        "(enable_sleep_mode_extra_cleanup=True; vllm-ascend #9585)", text, source)]
    return [Finding(SECTION, SUBJECT, WARN, f"vLLM-Ascend's extra clean-up after sleep is off ({CLEANUP_KEY}="
                    f"{value}): more device memory stays in use after each sleep (vllm-ascend #9585: 3.2 -> 0.7 GiB "
                    f"kept with expert parallel). Fix: {CLEANUP_OVERRIDE}", text, source)]
