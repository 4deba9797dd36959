"""The add-ons of member clusters: real upstream controllers (Kueue with MultiKueue,
metrics-server) built from the Go module proxy, one package each."""
