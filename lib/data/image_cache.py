"""A loader worker's least-recently-used cache of decoded images (TRAIN.IMAGE_CACHE_MB).

Decoding a large JPEG costs several times more than cutting and resizing one chip from it, and
SNIPER cuts several chips from every image (each scale, each chip). The loader sends every chip of
an image file to the same worker (ChipLoader routes by file), so a worker that keeps the images it
decoded recently decodes each one about once per epoch when its share of the set fits the cache;
when it does not, the hit rate falls towards (cache size / its share), never below decoding every
chip. The cached arrays are read-only: a chip never changes the pixels another chip reads, so the
batches are byte-identical whatever the cache size. Large images (lib.dataset.large_images) bypass the
cache: their chips read windows from the file.
"""
from collections import OrderedDict


class DecodedImageCache:
    """Decoded images by path, at most ``capacity_bytes`` in all (0 keeps none); least recently used out."""

    def __init__(self, capacity_bytes):
        if capacity_bytes < 0:
            raise ValueError(f"DecodedImageCache: capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity = int(capacity_bytes)
        self.nbytes = 0
        self._images = OrderedDict()

    def __len__(self):
        return len(self._images)

    def get(self, path, decode):
        """``(image, decoded)``: the cached image of ``path``, or ``decode(path)`` (kept if it fits);
        ``decoded`` tells which. Errors of ``decode`` propagate and nothing is kept."""
        image = self._images.get(path)
        if image is not None:
            self._images.move_to_end(path)
            return image, False
        image = decode(path)
        if image.nbytes <= self.capacity:
            image.setflags(write=False)
            self._images[path] = image
            self.nbytes += image.nbytes
            while self.nbytes > self.capacity:
                _, old = self._images.popitem(last=False)
                self.nbytes -= old.nbytes
        return image, True
