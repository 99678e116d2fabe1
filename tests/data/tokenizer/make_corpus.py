#!/usr/bin/env python3
"""Rebuilds the tokenizer conformance corpus from Debian files (fortunes-zh,
base-files licences, python3.11 stdlib) plus hand-written mixed.txt, which is
committed as is. Run from this folder; output is committed (small)."""
import re

def cut(s, n):
    s = s[:n]
    return s[: s.rfind("\n") + 1] if "\n" in s else s

ansi = re.compile(r"\x1b\[[0-9;]*m")
en = open("/usr/share/common-licenses/Apache-2.0").read() + cut(open("/usr/share/common-licenses/GPL-3").read(), 20000)
open("en_licenses.txt", "w").write(en)
zh = ansi.sub("", open("/usr/share/games/fortunes/tang300", encoding="utf-8").read())
zh = cut(zh, 14000) + cut(ansi.sub("", open("/usr/share/games/fortunes/chinese", encoding="utf-8").read()), 14000)
open("zh_fortunes.txt", "w").write(zh)
code = open("/usr/lib/python3.11/textwrap.py").read() + open("/usr/lib/python3.11/json/decoder.py").read()
# CRLF copy of part of the code, to cover \r\n handling
code += cut(code, 3000).replace("\n", "\r\n")
open("code_python.txt", "w", newline="").write(code)
