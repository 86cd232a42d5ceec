"""The auditors' audit-trail pages: browse and filter governance events, verify the hash chain,
download the signed export. Every one of these is itself an audit event (docs/portal.md)."""
