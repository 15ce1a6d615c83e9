"""The roidb cache: one signed file per dataset, image set and options, in ``{dataset.root_path}/cache``.

Its file name carries a hash of the annotation files' content and of every option that changes the
roidb, so an edited annotation file or a changed option builds a new roidb instead of serving a stale one.

The cache is a pickle (it holds the dataset object), so it is signed: each file starts with an
HMAC-SHA256 of the rest, keyed by a random secret created in the cache folder (``.roidb_cache_key``,
mode 0600, owned by the user). A cache that fails verification (copied from elsewhere, tampered with,
truncated) is never unpickled: it is rebuilt with a warning. A key file others can read or write is not
trusted: the cache is then bypassed, with a warning saying how to fix the permissions.
"""
import hashlib
import hmac
import json
import logging
import os
import pickle
import re
import secrets

from tqdm import tqdm

from lib.atomic import write_bytes

logger = logging.getLogger(__name__)

# Bump when the entry format or the reading rules change: old caches are then ignored.
CACHE_VERSION = 2
CACHE_KEY_FILE = ".roidb_cache_key"
KEY_BYTES = 32
TAG_BYTES = hashlib.sha256().digest_size


def _file_digest(path):
    digest = hashlib.sha1()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise type(err)(f"cannot read annotation file {path}: {err.strerror or err}") from None
    return digest.hexdigest()


def cache_path(root_path, dataset, training, flip, masks, keep_empty=False):
    """Cache file named after the dataset and a hash of its annotation files and the options."""
    files = dataset.annotation_files
    options = {"version": CACHE_VERSION, "kind": dataset.kind, "path": dataset.dataset_path,
               "image_set": dataset.image_set, "training": training, "flip": flip}
    if masks:  # only then, so that the caches of box-only training keep their names
        options["masks"] = True
    if keep_empty:  # TRAIN.EMPTY_IMAGES negative; only then, as for masks
        options["empty_images"] = "negative"
    options.update(getattr(dataset, "cache_options", {}))  # e.g. own VOC classes (lib.dataset.pascal_voc)
    key = hashlib.sha1(json.dumps(options, sort_keys=True).encode())
    for path in tqdm(files, desc="hashing annotations", leave=False, disable=len(files) < 100):
        key.update(os.path.relpath(path, dataset.dataset_path).encode())
        key.update(_file_digest(path).encode())
    name = re.sub(r"[^\w+.-]", "_", f"{dataset.kind}_{dataset.image_set}_{'train' if training else 'test'}")
    return os.path.join(root_path, "cache", f"{name}_{key.hexdigest()[:16]}.pkl")


def _cache_secret(folder):
    """The HMAC key of the caches in ``folder``, created on first use; None (with a warning) when the key
    file could have been read or replaced by someone else."""
    path = os.path.join(folder, CACHE_KEY_FILE)
    try:
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            tmp = f"{path}.new-{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, secrets.token_bytes(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:  # whole or not at all, and the first of concurrent runs wins
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                os.remove(tmp)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            info = os.fstat(fd)
            secret = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as err:
        logger.warning("roidb cache key %s cannot be used (%s); the roidb is built without the cache", path, err)
        return None
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or len(secret) != KEY_BYTES:
        logger.warning("roidb cache key %s is not a %d-byte file private to this user (mode %o, owner %d): caches "
                       "signed with it are not trusted and the roidb is built without the cache; remove the key "
                       "file and the caches beside it to start afresh", path, KEY_BYTES, info.st_mode & 0o777,
                       info.st_uid)
        return None
    return secret


def read_cache(path):
    """``(dataset, roidb)`` from the cache file ``path`` when it exists and verifies, else None."""
    if not os.path.isfile(path):
        return None
    secret = _cache_secret(os.path.dirname(path))
    if secret is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        logger.warning("ignoring unreadable roidb cache %s (%s); rebuilding it", path, err)
        return None
    tag, payload = data[:TAG_BYTES], data[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(secret, payload, hashlib.sha256).digest()):
        logger.warning("roidb cache %s fails verification against %s (truncated, altered or not written here); "
                       "not loading it, rebuilding it", path, CACHE_KEY_FILE)
        return None
    try:
        dataset, roidb = pickle.loads(payload)  # written by this user with this key: trusted
        return dataset, roidb
    except Exception as err:  # a cache is disposable: any failure means "rebuild"
        logger.warning("ignoring unreadable roidb cache %s (%s); rebuilding it", path, err)
        return None


def write_cache(path, content):
    """Signed and written atomically (``lib.atomic``), so a killed run never leaves a truncated cache."""
    secret = _cache_secret(os.path.dirname(path))
    if secret is None:
        return
    payload = pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        write_bytes(hmac.new(secret, payload, hashlib.sha256).digest() + payload, path)
    except OSError as err:  # the cache only saves time: warn and go on
        logger.warning("cannot write roidb cache %s: %s", path, err)
