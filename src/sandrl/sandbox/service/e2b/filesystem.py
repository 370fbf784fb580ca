"""envd's ``filesystem.Filesystem`` service over sandrl sandboxes: stat, list, make dir, move, remove.

Each call runs a short POSIX shell script with GNU ``find`` inside the sandbox, so paths are
resolved in the sandbox's own mount namespace, as every sandrl file operation is; relative
paths start at the sandbox's workdir. Entries carry the permission bits as ``mode``, the
``ls``-style string as ``permissions``, and, for a symlink, the type of what it points to with
``is_symlink`` set. Watching directories is not supported yet.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import AsyncIterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from sandrl.errors import SandrlError
from sandrl.sandbox.base import ExecCall
from sandrl.sandbox.service.e2b.processes import connect_error
from sandrl.sandbox.service.e2b.proto import filesystem_pb as pb
from sandrl.sandbox.service.e2b.proto.filesystem_connect import Filesystem
from sandrl.sandbox.service.e2b.state import E2BRegistry, Refused, resolve
from sandrl.sandbox.service.state import Entry

FS_TIMEOUT_S = 60.0
_FIELDS = 10
_PRINTF = "%y\\0%Y\\0%s\\0%m\\0%M\\0%u\\0%g\\0%T@\\0%l\\0%p\\0"
_TYPES = {"f": pb.FileType.FILE, "d": pb.FileType.DIRECTORY}
# Exit codes of the scripts below: what went wrong, as envd's Connect codes.
_NOT_FOUND, _NOT_DIR, _EXISTS, _NOT_A_DIR_IN_THE_WAY = 3, 4, 5, 6
_EXISTS_TEST = '{ [ -e "$p" ] || [ -L "$p" ]; }'


def entry_of(fields: list[str]) -> pb.EntryInfo:
    kind, target_kind, size, mode, perms, owner, group, mtime, link, path = fields
    seconds, _, frac = mtime.partition(".")
    is_link = kind == "l"
    return pb.EntryInfo(
        name=posixpath.basename(path.rstrip("/")) or path,
        type=_TYPES.get(target_kind if is_link else kind, pb.FileType.UNSPECIFIED),
        path=path,
        size=int(size),
        mode=int(mode, 8),
        permissions=perms,
        owner=owner,
        group=group,
        modified_time=Timestamp(seconds=int(seconds or 0), nanos=int((frac + "000000000")[:9])),
        symlink_target=link if is_link else None,
        is_symlink=is_link,
    )


def entries_of(stdout: str) -> list[pb.EntryInfo]:
    parts = stdout.split("\0")
    return [entry_of(parts[i : i + _FIELDS]) for i in range(0, len(parts) - _FIELDS + 1, _FIELDS)]


def absolute(entry: Entry, path: str) -> str:
    """``path`` made absolute (relative paths start at the sandbox's workdir), without trailing slashes."""
    path = path if path.startswith("/") else posixpath.join(entry.spec.workdir, path)
    return path.rstrip("/") or "/"


def _find(path_var: str, *, depth: str = "-maxdepth 0") -> str:
    return f'find "{path_var}" {depth} -printf {shlex.quote(_PRINTF)}'


class FilesystemService(Filesystem):
    """The ``filesystem.Filesystem`` Connect service (see :mod:`.proto.filesystem_connect`)."""

    def __init__(self, registry: E2BRegistry) -> None:
        self.registry = registry

    def _entry(self, ctx: RequestContext[Any, Any]) -> Entry:
        try:
            entry, _ = resolve(self.registry, ctx.request_headers)
        except Refused as exc:
            raise connect_error(exc) from None
        return entry

    async def _run(self, entry: Entry, script: str, what: str, **paths: str) -> str:
        for name, value in paths.items():
            if not value or "\0" in value:
                raise ConnectError(Code.INVALID_ARGUMENT, f"{name} must be a non-empty path without NUL bytes")
        assigns = " ".join(f"{name}={shlex.quote(absolute(entry, v))}" for name, v in paths.items())
        svc = self.registry.service
        try:
            result = await svc.exec(entry, ExecCall(f"{assigns}; {script}", timeout_s=FS_TIMEOUT_S))
        except SandrlError as exc:
            raise connect_error(exc) from exc
        shown = next(iter(paths.values()))
        if result.exit_code == 0:
            return result.stdout
        if result.exit_code == _NOT_FOUND:
            raise ConnectError(Code.NOT_FOUND, f"{what}: {shown}: no such file or directory")
        if result.exit_code == _NOT_DIR:
            raise ConnectError(Code.INVALID_ARGUMENT, f"{what}: {shown} is not a directory")
        if result.exit_code == _EXISTS:
            raise ConnectError(Code.ALREADY_EXISTS, f"{what}: {shown} already exists")
        if result.exit_code == _NOT_A_DIR_IN_THE_WAY:
            raise ConnectError(Code.INVALID_ARGUMENT, f"{what}: {shown} exists and is not a directory")
        detail = result.stderr.strip()[-500:] or f"exit code {result.exit_code}"
        raise ConnectError(Code.INTERNAL, f"{what}: {shown}: {detail}")

    async def stat(
        self, request: pb.StatRequest, ctx: RequestContext[pb.StatRequest, pb.StatResponse]
    ) -> pb.StatResponse:
        entry = self._entry(ctx)
        out = await self._run(entry, f"{_EXISTS_TEST} || exit {_NOT_FOUND}; {_find('$p')}", "stat", p=request.path)
        return pb.StatResponse(entry=entries_of(out)[0])

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[pb.ListDirRequest, pb.ListDirResponse]
    ) -> pb.ListDirResponse:
        entry = self._entry(ctx)
        depth = max(1, request.depth)
        script = f'{_EXISTS_TEST} || exit {_NOT_FOUND}; [ -d "$p" ] || exit {_NOT_DIR}; ' + _find(
            "$p", depth=f"-mindepth 1 -maxdepth {depth}"
        )
        out = await self._run(entry, script, "list", p=request.path)
        return pb.ListDirResponse(entries=entries_of(out))

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[pb.MakeDirRequest, pb.MakeDirResponse]
    ) -> pb.MakeDirResponse:
        entry = self._entry(ctx)
        script = (
            f'[ -d "$p" ] && exit {_EXISTS}; {_EXISTS_TEST} && exit {_NOT_A_DIR_IN_THE_WAY}; '
            f'mkdir -p -- "$p" && {_find("$p")}'
        )
        out = await self._run(entry, script, "make dir", p=request.path)
        return pb.MakeDirResponse(entry=entries_of(out)[0])

    async def move(
        self, request: pb.MoveRequest, ctx: RequestContext[pb.MoveRequest, pb.MoveResponse]
    ) -> pb.MoveResponse:
        entry = self._entry(ctx)
        script = (
            f'p="$src"; {_EXISTS_TEST} || exit {_NOT_FOUND}; '
            f'mkdir -p -- "$(dirname -- "$dst")" && mv -f -T -- "$src" "$dst" && {_find("$dst")}'
        )
        out = await self._run(entry, script, "move", src=request.source, dst=request.destination)
        return pb.MoveResponse(entry=entries_of(out)[0])

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[pb.RemoveRequest, pb.RemoveResponse]
    ) -> pb.RemoveResponse:
        entry = self._entry(ctx)
        await self._run(entry, f'{_EXISTS_TEST} || exit {_NOT_FOUND}; rm -rf -- "$p"', "remove", p=request.path)
        return pb.RemoveResponse()

    def _no_watch(self, ctx: RequestContext[Any, Any]) -> ConnectError:
        self._entry(ctx)
        return ConnectError(
            Code.UNIMPLEMENTED,
            "watching directories is not supported yet by sandrl: poll with files.list or run `find -newer` instead",
        )

    def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[pb.WatchDirRequest, pb.WatchDirResponse]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        raise self._no_watch(ctx)

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[pb.CreateWatcherRequest, pb.CreateWatcherResponse]
    ) -> pb.CreateWatcherResponse:
        raise self._no_watch(ctx)

    async def get_watcher_events(
        self,
        request: pb.GetWatcherEventsRequest,
        ctx: RequestContext[pb.GetWatcherEventsRequest, pb.GetWatcherEventsResponse],
    ) -> pb.GetWatcherEventsResponse:
        raise self._no_watch(ctx)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[pb.RemoveWatcherRequest, pb.RemoveWatcherResponse]
    ) -> pb.RemoveWatcherResponse:
        raise self._no_watch(ctx)
