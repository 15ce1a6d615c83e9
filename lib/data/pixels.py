"""The network's pixel convention, shared by training chips and test images (spec section 4).

Images are decoded as BGR (lib.dataset.read_image); the network is fed RGB by default, as the reference
did and as its published checkpoints and the MXNet model-zoo ResNets expect: input channel c is image
channel (2 - c) minus ``PIXEL_MEANS[2 - c]`` (the means are listed in BGR order). ``network.CHANNEL_ORDER
BGR`` feeds the channels as decoded instead.
"""
import numpy as np

CHANNEL_ORDERS = ("RGB", "BGR")


def channel_sources(channel_order):
    """The image channel (of a BGR image) that feeds each network input channel."""
    if channel_order not in CHANNEL_ORDERS:
        raise ValueError(f"config key network.CHANNEL_ORDER: expected one of {CHANNEL_ORDERS}, got {channel_order!r}")
    return (2, 1, 0) if channel_order == "RGB" else (0, 1, 2)


def network_pixels(image, pixel_means, channel_order, out):
    """Write ``image`` (BGR uint8 (h, w, 3)) into ``out`` (3, >= h, >= w) float32, top-left corner, in
    the network's channel order minus the (BGR-ordered) ``pixel_means`` (the config's floats: a float32
    copy of them is not the same number); the rest of ``out`` is left as it is."""
    height, width = image.shape[:2]
    for channel, source in enumerate(channel_sources(channel_order)):
        # in double, rounded once to float32, as the reference computes it (a float32 mean differs by an
        # ulp, which a deep network turns into visibly different boxes)
        np.subtract(image[:, :, source], np.float64(pixel_means[source]), out=out[channel, :height, :width],
                    casting="unsafe")
    return out
