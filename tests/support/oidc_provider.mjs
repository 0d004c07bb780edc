// An external identity provider for the tests: the certified `oidc-provider` from npm, configured from the
// environment. It signs with the key the test hands it (OIDC_JWKS, a private JWK set), so that the test can
// also forge the bad tokens a resource server must refuse; access tokens for OIDC_RESOURCE are JWTs (RFC 9068).
//
// With OIDC_UPSTREAM_RESOURCE it is also the authorization server of a protected upstream
// (tests/support/protected_upstream.py): JWT access tokens for it carry scope `upstream` and live
// OIDC_UPSTREAM_TTL seconds (300 unless set); a person gets one by the authorization code flow (with
// `offline_access` and prompt=consent, a refresh token too), and a confidential client exchanges a person's token
// for the gateway for one (RFC 8693 token exchange, below).
//
// Refusing: the login and consent pages of devInteractions link "[ Cancel ]" to GET /interaction/<uid>/abort,
// which finishes the interaction with access_denied ("End-User aborted interaction"); following the redirects
// from there lands on the client's redirect_uri with error=access_denied.
import { readFileSync } from "node:fs";
import Provider, { errors } from "oidc-provider";
import { createLocalJWKSet, jwtVerify } from "jose"; // oidc-provider's own JOSE library (its dependency)

const port = Number(process.env.OIDC_PORT);
const issuer = `http://127.0.0.1:${port}`;
const resource = process.env.OIDC_RESOURCE;
const upstream = process.env.OIDC_UPSTREAM_RESOURCE;
const jwks = JSON.parse(process.env.OIDC_JWKS);
const jwtAccess = (scope, audience, accessTokenTTL) => ({ scope, audience, accessTokenTTL, accessTokenFormat: "jwt" });
const resourceServers = new Map([[resource, jwtAccess("mcp", resource, 300)]]);
if (upstream) {
  resourceServers.set(upstream, jwtAccess("upstream", upstream, Number(process.env.OIDC_UPSTREAM_TTL || 300)));
}
// OIDC_GROUPS_FILE, read at every sign-in, may give a login other groups ({"sub": ["group", ...]}): the test changes
// a person's groups at the IdP between two sign-ins.
const groupsGiven = () => (process.env.OIDC_GROUPS_FILE ? JSON.parse(readFileSync(process.env.OIDC_GROUPS_FILE)) : {});
const groupsOf = (sub) => {
  const given = groupsGiven();
  if (Object.hasOwn(given, sub)) return given[sub];
  const role = sub.split("-")[0];
  return ["admin", "auditor", "reader"].includes(role) ? [`switchboard-${role}s`] : ["engineers"];
};
const provider = new Provider(issuer, {
  clients: JSON.parse(process.env.OIDC_CLIENTS),
  jwks,
  claims: { openid: ["sub"], email: ["email"], profile: ["name"], groups: ["groups"] },
  scopes: ["openid", "offline_access", "mcp", ...(upstream ? ["upstream"] : [])],
  // A login's first word names its groups: "admin-…", "auditor-…" and "reader-…" are in the console's.
  findAccount: (ctx, sub) => ({
    accountId: sub,
    claims: () => ({ sub, email: `${sub}@example.test`, name: `Person ${sub}`, groups: groupsOf(sub) }),
  }),
  // What an access token says of its person beside `sub` (as Keycloak, Entra and Okta can be set to).
  extraTokenClaims: (ctx, token) =>
    token.accountId ? { name: `Person ${token.accountId}`, email: `${token.accountId}@example.test` } : {},
  features: {
    clientCredentials: { enabled: true },
    registration: { enabled: true }, // open dynamic client registration, as MCP clients expect
    devInteractions: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // The console's own sign-in asks for no resource: its access token is for the userinfo endpoint.
      defaultResource: (ctx, client) => (client.clientId === "console" ? undefined : resource),
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator) => {
        if (!resourceServers.has(indicator)) throw new errors.InvalidTarget(`unknown resource ${indicator}`);
        return resourceServers.get(indicator);
      },
    },
  },
  pkce: { required: () => true },
});

// RFC 8693 token exchange: a confidential client (authenticated by the token endpoint before this runs) trades a
// person's access token for the gateway (OIDC_RESOURCE) for one for the upstream, with the same `sub`.
const EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token";
// Public halves: no private members, and no key_ops ["sign"] (a verifying key set skips keys not for "verify").
const publicJwk = ({ d, p, q, dp, dq, qi, key_ops, ...key }) => key;
const ownKeys = createLocalJWKSet({ keys: jwks.keys.map(publicJwk) });

async function subjectOf(subjectToken) {
  try {
    const options = { issuer, audience: resource, typ: "at+jwt", algorithms: ["RS256", "PS256", "ES256"] };
    const { payload } = await jwtVerify(subjectToken, ownKeys, options);
    return payload.sub;
  } catch (cause) {
    const why = cause.claim ? `${cause.code} ${cause.claim}` : cause.code; // for the log only (grant.error)
    const detail = `subject_token is not an access token this provider issued for the gateway (${why})`;
    throw new errors.InvalidGrant(detail);
  }
}

function checkExchange(params) {
  if (!params.subject_token) throw new errors.InvalidRequest("missing required parameter 'subject_token'");
  if (params.subject_token_type !== ACCESS_TOKEN) {
    throw new errors.InvalidRequest(`subject_token_type must be ${ACCESS_TOKEN}`);
  }
  if (params.requested_token_type && params.requested_token_type !== ACCESS_TOKEN) {
    throw new errors.InvalidRequest(`requested_token_type must be ${ACCESS_TOKEN}`);
  }
  const targets = new Set([params.audience, params.resource].flat().filter(Boolean));
  if (!upstream || targets.size !== 1 || !targets.has(upstream)) {
    throw new errors.InvalidTarget("audience or resource must name the upstream resource");
  }
  if (params.scope && params.scope.split(" ").some((scope) => scope !== "upstream")) {
    throw new errors.InvalidScope("only the scope upstream is issued", params.scope);
  }
}

async function tokenExchange(ctx) {
  const { params, client } = ctx.oidc;
  checkExchange(params);
  const token = new provider.AccessToken({
    accountId: await subjectOf(params.subject_token),
    client,
    gty: EXCHANGE,
    resourceServer: new provider.ResourceServer(upstream, resourceServers.get(upstream)),
    scope: "upstream",
  });
  ctx.oidc.entity("AccessToken", token);
  const accessToken = await token.save();
  ctx.body = {
    access_token: accessToken,
    issued_token_type: ACCESS_TOKEN,
    token_type: token.tokenType,
    expires_in: token.expiration,
    scope: token.scope,
  };
}

const exchangeParameters = ["audience", "resource", "scope", "requested_token_type", "subject_token"];
exchangeParameters.push("subject_token_type", "actor_token", "actor_token_type");
provider.registerGrantType(EXCHANGE, tokenExchange, exchangeParameters, ["audience", "resource"]);

// The reason behind a refused grant (its response says only "grant request is invalid"), for the test's log.
provider.on("grant.error", (ctx, err) => {
  console.log(`grant.error ${err.error}: ${err.error_detail ?? err.error_description}`);
});
provider.listen(port, "127.0.0.1", () => console.log(`oidc-provider listening on ${issuer}`));
