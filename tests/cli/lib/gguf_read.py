"""A GGUF file read with plain Python, for tests/cli/llama_cpp.sh: written here from the format
(ggml's gguf.h, version 3), independently of fp4train's own reader (src/base/gguf.cpp)."""
import struct

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


def read(b):
    """(kv, tensors, data): kv maps each key to its value (lists for arrays), tensors maps each
    name to (ne, ggml type, offset from the data section), data is the data section's byte
    offset (alignment 32, the only one fp4train writes)."""
    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3, "not GGUF v3"
    nt, nkv = struct.unpack_from("<QQ", b, 8)
    pos = 24

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, b, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def rs():
        nonlocal pos
        n = rd("<Q")
        s = bytes(b[pos:pos + n]).decode()
        pos += n
        return s

    def val(t):
        if t == 8:
            return rs()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            return [val(et) for _ in range(n)]
        return rd(_SCALAR[t])

    kv = {}
    for _ in range(nkv):
        k = rs()
        kv[k] = val(rd("<I"))
    tensors = {}
    for _ in range(nt):
        name = rs()
        ne = [rd("<Q") for _ in range(rd("<I"))]
        t = rd("<I")
        tensors[name] = (ne, t, rd("<Q"))
    return kv, tensors, (pos + 31) // 32 * 32
