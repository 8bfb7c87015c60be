#!/usr/bin/env python3
"""Verify the DKIM signatures of one message with dkimpy, an independent
implementation, answering its DNS look-ups from records given on the
command line instead of asking DNS.

usage: dkim_verify.py MESSAGE_FILE NAME=TXT_VALUE [NAME=TXT_VALUE ...]

Prints one JSON object: {"results": [{"ok": bool, "error": str|null,
"d": ..., "s": ..., "a": ..., "h": [...]}, ...], "lookups": [...]}. Exit 0 when it could check
(whatever the verdict), 3 when dkimpy (or PyNaCl, for ed25519) is missing.
"""
import json
import sys

try:
    import dkim
    import nacl.signing  # noqa: F401  (dkimpy needs it for ed25519)
except ImportError as e:
    print(f"dkim_verify.py: {e}: run scripts/install-deps.sh "
          "(python3 -m pip install dkimpy pynacl)", file=sys.stderr)
    sys.exit(3)


def main():
    message = open(sys.argv[1], "rb").read()
    records = {}
    for arg in sys.argv[2:]:
        name, _, value = arg.partition("=")
        records[name.rstrip(".").lower()] = value.encode()
    lookups = []

    def dnsfunc(name, timeout=5):
        name = name.decode() if isinstance(name, bytes) else name
        lookups.append(name)
        return records.get(name.rstrip(".").lower())

    d = dkim.DKIM(message)
    results = []
    for k in range(len([h for h in d.headers if h[0].lower() == b"dkim-signature"])):
        error = None
        try:
            ok = d.verify(idx=k, dnsfunc=dnsfunc)
        except dkim.DKIMException as e:
            # some failures (a body hash mismatch) are raised, not returned
            ok, error = False, str(e)
        sig = d.signature_fields or {}
        results.append({
            "ok": bool(ok),
            "error": error,
            "d": sig.get(b"d", b"").decode(),
            "s": sig.get(b"s", b"").decode(),
            "a": sig.get(b"a", b"").decode(),
            "h": [h.strip().decode().lower() for h in sig.get(b"h", b"").split(b":") if h.strip()],
        })
    print(json.dumps({"results": results, "lookups": lookups}))


main()
