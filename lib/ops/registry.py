"""What a compiled operator library registers, read from the library itself through lib_api's own
C entry points (``_opRegSize``, ``_opRegGet``), the ones MXNet's ``mx.library.load`` reads.

This tells whether a build has a GPU forward without a GPU, a CUDA MXNet or a CUDA toolkit: a string
or symbol in the binary could come from anywhere, the registration is what MXNet will act on.
"""
import ctypes

_CHAR_PP = ctypes.POINTER(ctypes.c_char_p)
_VOID_PP = ctypes.POINTER(ctypes.c_void_p)


def registered_operators(path, preload=()):
    """``{operator name: {"forward": [contexts], "backward": [contexts]}}`` of the library at ``path``.

    ``preload``: shared libraries to load first with global symbols, for a library whose dependencies
    are not on the loader's path (the CUDA variant's libcudart).
    """
    for dependency in preload:
        ctypes.CDLL(dependency, mode=ctypes.RTLD_GLOBAL)
    library = ctypes.CDLL(path)
    library._opRegGet.restype = None
    operators = {}
    for index in range(library._opRegSize()):
        name, is_subgraph_op = ctypes.c_char_p(), ctypes.c_int()
        contexts = {kind: (_CHAR_PP(), _VOID_PP(), ctypes.c_int()) for kind in ("forward", "backward", "create")}
        callbacks = [ctypes.c_void_p() for _ in range(5)]  # parse, type, storage type, shape, mutate
        arguments = [ctypes.byref(name), ctypes.byref(is_subgraph_op)]
        for kind in ("forward", "backward", "create"):
            arguments.extend(ctypes.byref(part) for part in contexts[kind])
        arguments.extend(ctypes.byref(callback) for callback in callbacks)
        library._opRegGet(ctypes.c_int(index), *arguments)
        operators[name.value.decode()] = {
            # sorted and unique: lib_api appends the list again on every _opRegGet (MXNet reads it once)
            kind: sorted({contexts[kind][0][i].decode() for i in range(contexts[kind][2].value)})
            for kind in ("forward", "backward")}
    return operators
