"""A developer's self service in the portal: request a use case, follow its status, get
ready-to-paste code for an approved key, and try the use case in the playground."""
