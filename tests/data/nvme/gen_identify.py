#!/usr/bin/env python3
"""Generates the NVMe Identify fixtures used by tests/unit/test_nvme.c.

Each .bin file is one raw 4096-byte Identify data structure, laid out as in
the NVMe Base Specification 2.0 (Identify Controller: CNS 01h; Identify
Namespace: CNS 00h), little-endian. The values imitate a 3.84 TB data-center
drive with two LBA formats (512 and 4096 bytes). Re-run after editing:
    python3 tests/data/nvme/gen_identify.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
LEN = 4096


def ascii_field(text, width):
    raw = text.encode("ascii")
    assert len(raw) <= width
    return raw + b" " * (width - len(raw))  # NVMe pads ASCII fields with spaces


def id_ctrl(serial, model, firmware, vid=0x144D):
    buf = bytearray(LEN)
    struct.pack_into("<HH", buf, 0, vid, vid)              # VID, SSVID
    buf[4:24] = ascii_field(serial, 20)                   # SN
    buf[24:64] = ascii_field(model, 40)                   # MN
    buf[64:72] = ascii_field(firmware, 8)                 # FR
    struct.pack_into("<I", buf, 80, 0x00010400)           # VER 1.4
    struct.pack_into("<I", buf, 516, 32)                  # NN
    return bytes(buf)


def lbaf(lbads, ms=0, rp=0):
    return ms | (lbads << 16) | (rp << 24)


def id_ns(nsze, formats, active, nguid, eui64):
    buf = bytearray(LEN)
    struct.pack_into("<QQQ", buf, 0, nsze, nsze, nsze // 2)  # NSZE, NCAP, NUSE
    buf[25] = len(formats) - 1                                # NLBAF (0-based)
    buf[26] = (active & 0x0F) | ((active >> 4) & 0x03) << 5   # FLBAS
    buf[104:120] = nguid
    buf[120:128] = eui64
    for i, f in enumerate(formats):
        struct.pack_into("<I", buf, 128 + 4 * i, f)
    return bytes(buf)


NGUID = bytes(range(0x10, 0x20))
EUI64 = bytes([0x00, 0x25, 0x38, 0xB1, 0x21, 0x90, 0x4A, 0x7F])
FORMATS = [lbaf(9, rp=2), lbaf(12, rp=0)]

FIXTURES = {
    "id_ctrl.bin": id_ctrl("S64ANS0T123456", "SAMSUNG MZQL23T8HCLS-00A07", "GDC5602Q"),
    # 3.84 TB formatted with 4096-byte blocks (FLBAS = 1) ...
    "id_ns_4k.bin": id_ns(937684566, FORMATS, 1, NGUID, EUI64),
    # ... and with 512-byte blocks (FLBAS = 0).
    "id_ns_512.bin": id_ns(7501476528, FORMATS, 0, NGUID, EUI64),
}

if __name__ == "__main__":
    for name, data in FIXTURES.items():
        assert len(data) == LEN
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
        print("wrote", name)
