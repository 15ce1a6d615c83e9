"""The reference's published files, downloaded, verified and installed (front: ``tools/download.py``).

The reference offers three archives (its ``scripts/download_*.sh``): the pretrained backbones
(``pretrained_model.tar.gz`` into ``data/``: ``data/pretrained_model/``), the trained SNIPER and AutoFocus
detectors (``sniper_models.tar.gz`` into the repository: ``output/...``) and the negative-chip proposals
(``proposals.tar.gz`` into ``data/``: ``data/proposals/``). ``install`` streams an archive with a progress bar
into a temporary file beside its destination while hashing it, checks its SHA-256 and only then unpacks it
(``tarfile``'s ``data`` filter: no absolute paths, no ``..``, no links out, no devices) into a staging folder,
converts what needs it there and moves each file into place; anything that fails (a wrong checksum, a
connection cut short, Ctrl-C, a bad member) leaves no partial file behind and nothing installed.

A file is installed only when its checksum is known: recorded in ``ARTIFACTS`` or given by the user
(``sha256=``). The reference publishes none and its files could not be fetched where this was written, so none
is recorded: installing needs ``sha256`` from a source the user trusts, or ``verify=False`` (the user takes the
file as it comes; its SHA-256 is logged so that it can be recorded).

Conversion: the detectors' and backbones' ``.params`` are MXNet array files (no pickle), which the project
reads as they are (``lib.run.checkpoint.load_params`` takes a reference checkpoint's ``_test`` regressor);
each is read once to prove it. The proposals are Python pickles: from a verified archive each ``.pkl`` becomes
an ``.npz`` (``lib.dataset.proposals.convert_pickle``, the project's one deliberate unpickling; a pickle it
cannot convert is installed as it is, with the reason); from an unverified one nothing is unpickled, the
pickles are installed with the ``tools/convert_proposals.py`` command that converts one you trust.
"""
import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass

from tqdm import tqdm

from lib.atomic import atomic_open
from lib.bootstrap import ROOT
from lib.errors import DataError, DataFileError, UserError

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
USER_AGENT = "SNIPER-mxnet downloader"


@dataclass(frozen=True)
class Artifact:
    name: str
    what: str
    url: str
    archive: str
    dest: str  # relative to the repository root, where the archive unpacks
    sha256: str = ""  # "" where none is known
    proposals: bool = False  # holds pickled proposals to convert


ARTIFACTS = {a.name: a for a in (
    Artifact("pretrained", "the reference's pretrained backbones (data/pretrained_model/: the OpenImages "
             "ResNet-101 its COCO configs start from, and its other ImageNet models)", "https://bit.ly/2WgSJ6b",
             "pretrained_model.tar.gz", "data"),
    Artifact("detectors", "the published SNIPER detectors (COCO ResNet-101 and MobileNetV2, Pascal VOC) and the "
             "AutoFocus detector (output/...)", "https://bit.ly/3j6mAXJ", "sniper_models.tar.gz", "."),
    Artifact("proposals", "the negative-chip proposals of COCO and Pascal VOC (data/proposals/)",
             "https://bit.ly/3j8SOl7", "proposals.tar.gz", "data", proposals=True),
)}


class DownloadError(UserError, OSError):
    """A file that could not be fetched whole, or failed its checksum."""


def download(url, path, expected_sha256="", progress=True):
    """Stream ``url`` to ``path`` (atomically: nothing at ``path`` unless the whole file arrived and, when
    ``expected_sha256`` is given, matches it); returns the file's SHA-256."""
    digest = hashlib.sha256()
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=60) as response, atomic_open(path) as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            received = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(path), disable=not progress) as bar:
                for block in iter(lambda: response.read(CHUNK), b""):
                    out.write(block)
                    digest.update(block)
                    received += len(block)
                    bar.update(len(block))
            if total is not None and received != total:
                raise DownloadError(f"{url}: the connection ended after {received} of {total} bytes; nothing was "
                                    f"installed, run the download again")
            if expected_sha256 and digest.hexdigest() != expected_sha256:
                raise DownloadError(f"{url}: SHA-256 {digest.hexdigest()} is not the expected {expected_sha256}: "
                                    f"the file is damaged or not the published one, and was not installed")
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        if isinstance(err, UserError):
            raise
        raise DownloadError(f"cannot download {url}: {getattr(err, 'reason', None) or err}; nothing was "
                            f"installed") from None
    return digest.hexdigest()


def install(artifact, dest=None, sha256="", verify=True, progress=True):
    """Download ``artifact`` (an Artifact) and install its files under ``dest`` (default: its folder in the
    repository); returns the installed paths. ``sha256`` (hex) replaces the recorded checksum and is checked
    whatever ``verify`` says; without either, ``verify`` must be false (module docstring)."""
    expected = (sha256 or artifact.sha256).lower()
    if verify and not expected:
        raise DataError(f"no SHA-256 is recorded for the {artifact.name} archive ({artifact.url}), so it cannot be "
                        f"verified: pass --sha256 HEX from a source you trust, or --no-verify to take the file as it "
                        f"comes (its pickled proposals are then not converted)")
    dest = os.path.abspath(dest or os.path.join(ROOT, artifact.dest))
    staging = os.path.join(dest, f".tmp-download-{os.getpid()}-{artifact.name}")
    try:
        archive = os.path.join(staging, artifact.archive)
        os.makedirs(staging)
        logger.info("downloading %s: %s", artifact.name, artifact.what)
        digest = download(artifact.url, archive, expected, progress)
        logger.info("%s: SHA-256 %s (%s)", artifact.archive, digest, "verified" if expected else
                    "NOT verified: --no-verify; record it to check later downloads with --sha256")
        unpacked = os.path.join(staging, "files")
        unpack(archive, unpacked)
        os.remove(archive)
        convert(unpacked, artifact, verified=bool(expected))
        return move_into_place(unpacked, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def unpack(archive, folder):
    """Unpack the tar archive into ``folder`` with tarfile's ``data`` filter; a member it refuses (absolute,
    ``..``, a link out, a device) stops the installation."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
    except (tarfile.TarError, EOFError) as err:
        raise DataFileError(f"{os.path.basename(archive)}: not a readable tar archive, or a member that would "
                            f"land outside its folder ({err}); nothing was installed") from None


def convert(folder, artifact, verified):
    """The project's formats, in the staging ``folder``: pickled proposals -> ``.npz`` (verified archives
    only), every ``.params`` read once as the project reads it."""
    from lib.dataset.proposals import convert_pickle
    from lib.run.checkpoint import load_params

    for path in sorted(_files(folder)):
        if path.endswith(".params"):
            load_params(path)  # an MXNet array file the project reads (a CheckpointError names a bad one)
        elif path.endswith(".pkl") and artifact.proposals:
            if not verified:
                logger.warning("%s: not converted (an unverified download is never unpickled); once you trust it: "
                               "python tools/convert_proposals.py %s %s", os.path.basename(path),
                               os.path.basename(path), os.path.basename(path)[:-4] + ".npz")
                continue
            try:
                count = convert_pickle(path, path[:-4] + ".npz")
            except DataError as err:
                logger.warning("%s: kept as a pickle, not converted: %s", os.path.basename(path), err)
                continue
            os.remove(path)
            logger.info("%s -> %s (%d images)", os.path.basename(path), os.path.basename(path)[:-4] + ".npz", count)


def move_into_place(folder, dest):
    """Move every file of ``folder`` to the same relative path under ``dest`` (each an ``os.replace``: a file
    is there whole or not at all); returns the installed paths."""
    installed = []
    for path in sorted(_files(folder)):
        target = os.path.join(dest, os.path.relpath(path, folder))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(path, target)
        installed.append(target)
    return installed


def _files(folder):
    for root, _, names in os.walk(folder):
        for name in names:
            yield os.path.join(root, name)
