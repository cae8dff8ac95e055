"""The only place that touches SGLang. Importing it checks the pinned version first."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

REQUIRED_SGLANG = "0.5.23"


class SGLangVersionError(ImportError):
    pass


def check_sglang_version(installed: str | None = None) -> str:
    """Fail clearly unless the installed sglang is exactly the release we override."""
    if installed is None:
        try:
            installed = version("sglang")
        except PackageNotFoundError as e:
            raise SGLangVersionError(
                f"radixflow_sglang requires sglang=={REQUIRED_SGLANG}, but sglang is not installed"
            ) from e
    if installed != REQUIRED_SGLANG:
        raise SGLangVersionError(
            f"radixflow_sglang overrides internals of sglang=={REQUIRED_SGLANG}; "
            f"installed sglang is {installed}. Install sglang=={REQUIRED_SGLANG}."
        )
    return installed


check_sglang_version()
