"""API keys and money: who calls (keyring), what each key may ask for, hold and spend (tenants, ratelimit, budgets),
what a request reserves before dispatch (reservation) and what it is billed (bill, costs). Value types shared by
several modules live in their own (tenant, budget, claims, bill), so that no two modules that act on them import
each other. Kept in Redis across gateways by cascade/service/redis/."""
