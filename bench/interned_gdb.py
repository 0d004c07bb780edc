"""A gdb script: CPython 3.11's table of interned strings in a live process (a worker, a web process), read from
the static `interned` dict of unicodeobject.c, whose symbols pyenv's build keeps (docs/reliability.md, "What RSS
keeps beyond Python's heap").

    gdb -p PID -batch -x bench/interned_gdb.py                    # live strings, the table's size, entries free
    INTERNED_WATCH=20 gdb -p PID -batch -x bench/interned_gdb.py  # and each string added to it for 20 s

A string interned and freed keeps its entry taken until the table is resized; at a resize the table is made for
three times its live strings, so it doubles when the free entries run out with more than a third of its slots'
worth alive. Watching stops the process at each addition (a breakpoint): use it for seconds, not minutes."""

import os
import struct
import threading
import time

import gdb

# 3.11.7's PyUnicode_InternInPlace: the line after PyDict_SetDefault returned the string itself, a new entry.
ADDED = "unicodeobject.c:15588"
ASCII_DATA = 48  # sizeof(PyASCIIObject): a compact ASCII string's characters follow it


def text(address: int) -> str:
    inferior = gdb.selected_inferior()
    header = bytes(inferior.read_memory(address, ASCII_DATA))
    length, state = struct.unpack_from("q", header, 16)[0], struct.unpack_from("I", header, 32)[0]
    if state >> 5 & 1 and state >> 6 & 1 and length < 400:  # compact and ASCII
        return bytes(inferior.read_memory(address + ASCII_DATA, length)).decode("ascii")
    return f"<{length} characters, not compact ASCII>"


class Added(gdb.Breakpoint):
    def stop(self) -> bool:
        print("added", repr(text(int(gdb.selected_frame().read_var("s")))), flush=True)
        return False


table = gdb.parse_and_eval("(PyDictObject*)interned")
keys = table["ma_keys"]
print(
    f"interned: {int(table['ma_used'])} live strings, 2^{int(keys['dk_log2_size'])} slots, "
    f"{int(keys['dk_nentries'])} entries taken, {int(keys['dk_usable'])} free"
)
if watch := float(os.environ.get("INTERNED_WATCH", "0")):
    Added(ADDED)

    def stop_watching() -> None:
        time.sleep(watch)
        gdb.post_event(lambda: gdb.execute("interrupt"))

    threading.Thread(target=stop_watching, daemon=True).start()
    gdb.execute("continue")
