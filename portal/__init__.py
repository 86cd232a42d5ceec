"""The browser UI for governance officers, developers and auditors."""
