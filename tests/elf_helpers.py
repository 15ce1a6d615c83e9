"""Hand-built ELF files with CUDA fat binaries in their ``.nv_fatbin`` section, for the tests of
dev/cuda_kernels.py and of the GPU build's object checker."""
import struct

ENTRY_HEADER = 64


def fat_binary(entries):
    """One fat binary: its 16-byte header, then per (kind, arch, payload) a 64-byte entry header with the
    kind at 0, the header size at 4, the payload size at 8 and the architecture at 28, then the payload."""
    body = b""
    for kind, arch, payload in entries:
        header = bytearray(ENTRY_HEADER)
        struct.pack_into("<HHIQ", header, 0, kind, 0x101, ENTRY_HEADER, len(payload))
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def elf_with_sections(sections):
    """A minimal 64-bit little-endian ELF file with the named sections (and the section-name table)."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name, _ in sections) + b".shstrtab\0"
    contents = [data for _, data in sections] + [names]
    offsets, data, position = [], b"", 64
    for content in contents:
        offsets.append(position + len(data))
        data += content
    table = position + len(data)
    headers = bytes(64)  # the null section
    name_offset = 1
    for index, content in enumerate(contents):
        name = (list(n for n, _ in sections) + [".shstrtab"])[index]
        headers += struct.pack("<IIQQQQIIQQ", name_offset, 1, 0, 0, offsets[index], len(content), 0, 0, 1, 0)
        name_offset += len(name) + 1
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, table, 0, 64, 0, 0, 64, len(contents) + 1,
                                 len(contents))
    return header + data + headers
