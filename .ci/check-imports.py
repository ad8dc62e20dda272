#!/usr/bin/env python3
"""Every module a target imports is declared as that target's own dependency in Package.swift.

SwiftPM's --explicit-target-dependency-import-check accepts a module that arrives transitively (the CLI
importing MailpushState through MailpushPipeline, say); this check does not. Toolchain modules are allowed.
"""

import json
import pathlib
import re
import subprocess
import sys

TOOLCHAIN = {"Foundation", "FoundationEssentials", "Dispatch", "Synchronization", "Testing", "XCTest",
             "Glibc", "Darwin", "Musl", "Android", "os", "_Concurrency", "Observation", "RegexBuilder",
             "Swift", "_StringProcessing", "CoreFoundation"}

root = pathlib.Path(__file__).resolve().parent.parent
package = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=root, check=True,
                                    capture_output=True, text=True).stdout)
problems = []
for target in package["targets"]:
    if target["type"] == "system":
        continue
    declared = set()
    for dependency in target["dependencies"]:
        for kind in ("byName", "product", "target"):
            if kind in dependency:
                declared.add(dependency[kind][0])
    folder = root / (target.get("path") or ("Tests" if target["type"] == "test" else "Sources")) / (
        "" if target.get("path") else target["name"])
    imports = set()
    for source in folder.rglob("*.swift"):
        imports |= set(re.findall(
            r"^[ \t]*(?:@\w+(?:\([^)\n]*\))?[ \t]+)*(?:(?:public|internal|package)[ \t]+)?import[ \t]+"
            r"(?:(?:struct|class|enum|protocol|func|var|let|typealias)[ \t]+)?(\w+)",
            source.read_text(), re.M))
    for module in sorted(imports - declared - TOOLCHAIN):
        problems.append(f"target {target['name']} imports {module} without declaring it in Package.swift")
for problem in problems:
    print(f"error: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
