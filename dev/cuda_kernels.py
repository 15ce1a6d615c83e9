"""Which GPU architectures a CUDA binary (e.g. libmxnet.so of a CUDA wheel) carries code for, read offline.

nvcc embeds device code in the ELF section ``.nv_fatbin``: a sequence of fat binaries (header magic
0xBA55ED50), each a list of entries that are either machine code for one architecture (kind 2, an
ELF "cubin" of SASS) or PTX for one virtual architecture (kind 1). The driver runs an entry of SASS
only on its own major architecture with an equal or higher minor (sm_86 code runs on sm_89, not on
sm_90), and compiles PTX of an equal or lower architecture at load time (JIT). A GPU with neither can
launch none of the binary's kernels ("no kernel image is available for execution on the device").

Reading the section needs no GPU, no driver and no CUDA toolkit (there is no cuobjdump on most
machines), so a GPU check can say before it starts whether a wheel can run at all.
"""
import mmap
import struct

FATBIN_MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
KIND_PTX, KIND_SASS = 1, 2


def fatbin_section(path):
    """The bytes of ``path``'s ``.nv_fatbin`` section, or None when it has none (a CPU-only binary)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        section_offset, = struct.unpack_from("<Q", data, 0x28)
        entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

        def header(index):  # (name offset, file offset, size)
            base = section_offset + index * entry_size
            name, = struct.unpack_from("<I", data, base)
            offset, size = struct.unpack_from("<QQ", data, base + 0x18)
            return name, offset, size

        _, names_offset, names_size = header(names_index)
        names = data[names_offset:names_offset + names_size]
        for index in range(count):
            name, offset, size = header(index)
            if names[name:names.index(b"\0", name)].decode() == SECTION:
                return bytes(data[offset:offset + size])
    return None


def fat_binaries(section):
    """Per fat binary in ``section`` (one per CUDA translation unit linked in), its ``[(kind, architecture)]``
    (kind KIND_SASS or KIND_PTX; architecture as 10 * major + minor, e.g. 86)."""
    binaries = []
    position = 0
    while position + 16 <= len(section):
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", section, position)
        if magic != FATBIN_MAGIC:
            position += 8  # fat binaries are 8-byte aligned; skip the padding between them
            continue
        entries = []
        entry, end = position + header_size, position + header_size + body_size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            architecture, = struct.unpack_from("<I", section, entry + 28)
            entries.append((kind, architecture))
            entry += entry_header + payload
        binaries.append(entries)
        position = end
    return binaries


def fatbin_entries(section):
    """``[(kind, architecture)]`` of every entry of every fat binary in ``section``."""
    return [entry for binary in fat_binaries(section) for entry in binary]


def architectures(path):
    """``{"sass": [archs], "ptx": [archs]}`` of the binary at ``path`` (both empty without device code)."""
    section = fatbin_section(path)
    entries = fatbin_entries(section) if section is not None else []
    return {"sass": sorted({a for kind, a in entries if kind == KIND_SASS}),
            "ptx": sorted({a for kind, a in entries if kind == KIND_PTX})}


def runnable_code(archs, compute_capability):
    """How a GPU of ``compute_capability`` (e.g. 90) runs a binary with ``archs`` (from ``architectures``):
    ``"sass"`` (machine code for it), ``"ptx-jit"`` (only PTX, compiled by the driver at first load:
    runs, slower to start, without the architecture's own instructions) or ``"none"`` (cannot run)."""
    major, minor = divmod(compute_capability, 10)
    if any(a // 10 == major and a % 10 <= minor for a in archs["sass"]):
        return "sass"
    if any(a <= compute_capability for a in archs["ptx"]):
        return "ptx-jit"
    return "none"
