"""Real registries for the image tests: Debian's ``docker-registry`` on loopback, images pushed by ``skopeo``.

- ``registry``: a plain registry for the whole session; ``auth_registry``: one with htpasswd basic auth
  (``AUTH_USER``/``AUTH_PASSWORD``). Tests share them, so each pushes to repository names of its own
  (``push_image`` makes them unique unless told a name).
- ``push_image``: writes an OCI layout with :mod:`sandrl.images.oci_layout` and pushes it; returns a
  :class:`PushedImage` with the references and digests.
- ``fault_proxy``: a :class:`~tests.images.fault_proxy.FaultProxy` in front of ``registry``, new for each test.

They skip only when the binaries are not installed (``apt-get install docker-registry skopeo``).
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from sandrl.images.local_registry import LocalRegistry
from sandrl.images.manifest import Descriptor, ImageConfig
from sandrl.images.oci_layout import LayerSpec, OCILayout
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import REASON as SANDBOX_REASON
from .fault_proxy import FaultProxy

AUTH_USER = "sandrl"
AUTH_PASSWORD = "s3cret pass:word"  # a space and a colon: basic auth splits at the first colon only

MISSING = [b for b in ("docker-registry", "skopeo") if shutil.which(b) is None]
REASON = f"{' and '.join(MISSING)} not installed (apt-get install docker-registry skopeo)" if MISSING else ""
needs_registry = pytest.mark.skipif(bool(MISSING), reason=REASON)
needs_umoci = pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci not installed (apt-get install umoci)")


def _require_tools() -> None:
    if MISSING:
        pytest.skip(REASON)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    _require_tools()
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    _require_tools()
    with LocalRegistry(tmp_path_factory.mktemp("auth-registry"), users={AUTH_USER: AUTH_PASSWORD}) as running:
        yield running


@pytest.fixture
def fault_proxy(registry: LocalRegistry) -> Iterator[FaultProxy]:
    with FaultProxy(registry.url) as proxy:
        yield proxy


@dataclass(frozen=True)
class PushedImage:
    """An image pushed to a local registry: ``ref`` is ``127.0.0.1:PORT/repo:tag``."""

    registry: LocalRegistry
    repository: str
    tag: str
    digest: str
    """The digest of what was pushed: the index for a multi-platform image, else the manifest."""
    layout: OCILayout
    manifests: tuple[Descriptor, ...]
    """The manifests written (one, or one per platform), with their platforms."""

    @property
    def ref(self) -> str:
        return f"{self.registry.host}/{self.repository}:{self.tag}"

    @property
    def ref_by_digest(self) -> str:
        return f"{self.registry.host}/{self.repository}@{self.digest}"

    def ref_via(self, host: str) -> str:
        """The same image named through another host (a proxy in front of the registry)."""
        return f"{host}/{self.repository}:{self.tag}"


class PushImage(Protocol):
    def __call__(
        self,
        layers: Sequence[LayerSpec],
        config: ImageConfig | None = None,
        *,
        platforms: Sequence[ImageConfig] = (),
        registry: LocalRegistry | None = None,
        repository: str | None = None,
        tag: str = "1",
    ) -> PushedImage: ...


_unique = itertools.count()


@pytest.fixture
def push_image(registry: LocalRegistry, tmp_path: Path) -> PushImage:
    """``push_image(layers, config)`` pushes one image; with ``platforms`` (one config per platform, all
    with the same layers) an index of them. To ``registry`` unless another is given (its own creds are used)."""
    default = registry

    def push(
        layers: Sequence[LayerSpec],
        config: ImageConfig | None = None,
        *,
        platforms: Sequence[ImageConfig] = (),
        registry: LocalRegistry | None = None,
        repository: str | None = None,
        tag: str = "1",
    ) -> PushedImage:
        target = registry or default
        repository = repository or f"test/image{next(_unique)}"
        layout = OCILayout(tmp_path / f"layout-{repository.replace('/', '-')}-{tag}")
        written = [layout.add_layer(spec) for spec in layers]
        if platforms:
            manifests = tuple(layout.add_image(written, platform) for platform in platforms)
            layout.add_index(manifests, tag=tag)
        else:
            manifests = (layout.add_image(written, config, tag=tag),)
        digest = target.push(layout.root, repository, tag=tag, all_platforms=bool(platforms))
        return PushedImage(target, repository, tag, digest, layout, manifests)

    return push


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    """A bubblewrap provider on a state directory of the session's own (its store takes the pulls)."""
    if SANDBOX_REASON is not None:
        pytest.skip(SANDBOX_REASON)
    p = BwrapProvider(tmp_path_factory.mktemp("images-state"))
    yield p
    p._close_all_sync()


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the small runnable rootfs made from this host goes (made on first use)."""
    return tmp_path_factory.mktemp("shell") / "rootfs"
