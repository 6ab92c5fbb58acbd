#!/usr/bin/env python3
"""Re-checks a `switchboard audit export` file without Switchboard: Python 3.8+, stdlib only.

    python3 audit_verify.py export.jsonl      # exit 0: chain intact; exit 1: the first bad position

The rules are those of docs/audit.md.
"""
import base64, hashlib, json, sys

ZERO = "0" * 64


def canonical(value):
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def ref(content):
    return {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}


def content(entry):  # the bytes an entry of `payloads` stands for (docs/audit.md)
    if entry["encoding"] == "json":
        return canonical(entry["content"])
    return entry["content"].encode("utf-8") if entry["encoding"] == "utf-8" else base64.b64decode(entry["content"], validate=True)


def check(path):
    lines = [json.loads(text) for text in open(path, encoding="utf-8") if text.strip()]
    positions, expected = [line["position"] for line in lines], sorted({line["position"] for line in lines})
    for i, p in enumerate(positions):
        if i and p <= positions[i - 1]:  # the first line out of place names the position
            if p in positions[:i]:
                return f"position {p}: duplicated"
            return f"position {next(e for e, q in zip(expected, positions) if e != q)}: out of order"
    head, versions, last_p = (lines[0]["prev_hash"] if lines else ZERO), {}, None
    for line in lines:
        p, data, digests = line["position"], dict(line["data"]), line.get("digests", {})
        if line["prev_hash"] != head:
            return f"position {p - 1 if last_p == p - 2 else p}: missing"
        for field, digest in digests.items():  # values present must match their digests
            if field in data and not (field == "password_hash" and data[field] == "«redacted»"):
                if field == "body":
                    raw = data["body"].encode("utf-8") if data.get("body_encoding") != "base64" else base64.b64decode(data["body"])
                else:
                    raw = canonical(data[field])
                if ref(raw) != digest:
                    return f"position {p}: altered ({field} does not match its digest)"
            data[field] = digest
        sizes = {d["sha256"]: d["size"] for d in digests.values()}
        for sha, entry in line.get("payloads", {}).items():  # payloads carried must match their digests
            try:
                if ref(content(entry)) != {"sha256": sha, "size": sizes.get(sha)}:
                    return f"position {p}: altered (payload {sha[:12]} does not match its digest)"
            except (KeyError, TypeError, AttributeError, ValueError):
                return f"position {p}: altered (payload {sha[:12]} cannot be read)"
        sealed = {k: v for k, v in line.items() if k not in ("hash", "prev_hash", "digests", "payloads")}
        sealed["data"] = data
        head = hashlib.sha256(head.encode("ascii") + b"\n" + canonical(sealed)).hexdigest()
        if head != line["hash"]:
            return f"position {p}: altered"
        last = versions.get(line["aggregate"], 0)
        if line["version"] != last + 1 and (last or lines[0]["prev_hash"] == ZERO):
            return f"position {p}: {'duplicated' if line['version'] <= last else 'out of order'}"
        versions[line["aggregate"]], last_p = line["version"], p
    start = lines[0]["prev_hash"] if lines else ZERO  # not zero: an export made with --after
    after = f" (from position {lines[0]['position']}, after prev_hash {start})" if start != ZERO else ""
    print(f"chain intact: {len(lines)} events, head {head}{after}")
    return None


if __name__ == "__main__":
    problem = check(sys.argv[1])
    if problem:
        print(f"chain broken at {problem}")
    sys.exit(1 if problem else 0)
