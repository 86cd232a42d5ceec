"""The live fleet view: one publisher reads what the fleet watcher and the gateways already
write to Valkey once a second and fans it out to every open page over Channels."""
