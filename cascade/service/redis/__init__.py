"""The store that N gateways share: the connection and its failure rules (store), admission places (places), the keys'
token buckets (buckets) and budgets (ledger), and the one queue of corrections Redis did not take (corrections).
Imported only when `[gateway.redis] url` is set."""
