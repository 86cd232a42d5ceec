// A real OpenID Connect provider for Switchyard's SSO tests, standing in for Keycloak.
//
// panva/oidc-provider (OpenID-certified) on node:http, laid out like a Keycloak realm so the
// portal's default endpoint derivation is exercised as it is in production:
//   {issuer} = http://127.0.0.1:{port}/realms/{realm}
//   {issuer}/.well-known/openid-configuration
//   {issuer}/protocol/openid-connect/{auth,token,userinfo,certs,logout}
// Its own login form checks passwords; consent is implied (Keycloak's "consent required: off").
// Tokens carry Keycloak's claims: realm_access.roles, groups, preferred_username, and for
// client-credentials tokens azp and preferred_username "service-account-<client_id>".
//
// Configuration: OIDC_CONFIG names a JSON file (see README.md); OIDC_PORT the port.
// Accounts are re-read from that file at every lookup, so a test can change a persona's roles
// at the "IdP" between two logins. Binds 127.0.0.1 only.

import { createHash, generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as http from 'node:http';

import { Provider, errors } from 'oidc-provider';

const configPath = process.env.OIDC_CONFIG;
const port = Number(process.env.OIDC_PORT || 0);
if (!configPath || !port) {
  console.error('usage: OIDC_CONFIG=config.json OIDC_PORT=port node provider.js');
  process.exit(2);
}

const readConfig = () => JSON.parse(readFileSync(configPath, 'utf8'));
const config = readConfig();
const realm = config.realm || 'switchyard';
const prefix = `/realms/${realm}`;
const issuer = `http://127.0.0.1:${port}${prefix}`;
const oidcPath = '/protocol/openid-connect';

const escapeHtml = (value) => String(value).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// --- accounts (re-read on every lookup) --------------------------------------------------------
function subjectOf(username, account) {
  if (account.sub) return account.sub;
  const hex = createHash('sha256').update(`${realm}:${username}`).digest('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

function accounts() {
  return Object.entries(readConfig().accounts || {}).map(([username, account]) => ({
    username, sub: subjectOf(username, account), ...account,
  }));
}

function accountClaims(account) {
  return {
    sub: account.sub,
    preferred_username: account.username,
    email: account.email,
    email_verified: true,
    given_name: account.given_name,
    family_name: account.family_name,
    name: [account.given_name, account.family_name].filter(Boolean).join(' ') || undefined,
    realm_access: account.realm_access || { roles: [] },
    groups: account.groups || [],
    ...(account.resource_access ? { resource_access: account.resource_access } : {}),
  };
}

// --- clients and service accounts --------------------------------------------------------------
// Service-account roles and groups are not client metadata: keep them aside for the token.
const serviceAccounts = new Map();
const clients = (config.clients || []).map(({ service_account: serviceAccount, ...client }) => {
  if (serviceAccount) serviceAccounts.set(client.client_id, serviceAccount);
  return client;
});
const resources = config.resources || {};
const defaultApiResource = config.default_resource;

// --- signing keys: given (so tests can sign with the realm's own key), else generated --------
function generatedJwks() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { keys: [{ ...jwk, kid: randomBytes(8).toString('hex'), alg: 'RS256', use: 'sig' }] };
}

const provider = new Provider(issuer, {
  clients,
  jwks: config.jwks || generatedJwks(),
  cookies: { keys: [randomBytes(32).toString('hex')] },
  claims: {
    // Keycloak's default client scopes put roles and groups into every token through mappers;
    // tying them to "openid" gives the same result here.
    openid: ['sub', 'realm_access', 'resource_access', 'groups'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name', 'given_name', 'family_name'],
  },
  conformIdTokenClaims: false, // like Keycloak's mappers: the ID token carries the claims too
  async findAccount(ctx, sub) {
    const account = accounts().find((a) => a.sub === sub);
    if (!account) return undefined;
    return { accountId: sub, claims: async () => accountClaims(account) };
  },
  interactions: { url: (ctx, interaction) => `${prefix}/login-actions/${interaction.uid}` },
  // First-party client: consent is implied, as in Keycloak with "consent required" off.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    const existing = grantId ? await ctx.oidc.provider.Grant.find(grantId) : undefined;
    const grant = existing || new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope([...ctx.oidc.requestParamScopes].join(' '));
    await grant.save();
    return grant;
  },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.body = `<!doctype html><html><head><title>Sign out</title></head><body>
<h1>Sign out of realm ${escapeHtml(realm)}?</h1>${form}
<button type="submit" form="op.logoutForm" name="logout" value="yes">Sign out</button>
</body></html>`;
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = '<!doctype html><html><body><h1>You are signed out</h1></body></html>';
      },
    },
    resourceIndicators: {
      enabled: true,
      // Client-credentials tokens are for the API by default, as Keycloak's audience mapper
      // does; user logins get an opaque token for userinfo.
      async defaultResource(ctx, client, oneOf) {
        if (oneOf) return oneOf;
        return ctx.oidc.params?.grant_type === 'client_credentials' ? defaultApiResource : undefined;
      },
      async getResourceServerInfo(ctx, indicator) {
        const server = resources[indicator];
        if (!server) throw new errors.InvalidTarget(`unknown resource ${indicator}`);
        return {
          scope: server.scope || 'api',
          audience: server.audience,
          accessTokenTTL: server.ttl || 300,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
      async useGrantedResource() { return false; },
    },
  },
  async extraTokenClaims(ctx, token) {
    if (token.kind !== 'ClientCredentials') return undefined;
    const serviceAccount = serviceAccounts.get(token.clientId) || {};
    return {
      azp: token.clientId,
      preferred_username: `service-account-${token.clientId}`,
      realm_access: serviceAccount.realm_access || { roles: [] },
      groups: serviceAccount.groups || [],
    };
  },
  routes: {
    authorization: `${oidcPath}/auth`,
    token: `${oidcPath}/token`,
    userinfo: `${oidcPath}/userinfo`,
    jwks: `${oidcPath}/certs`,
    end_session: `${oidcPath}/logout`,
    introspection: `${oidcPath}/token/introspect`,
    revocation: `${oidcPath}/revoke`,
  },
  ttl: {
    AccessToken: 300,
    AuthorizationCode: 60,
    ClientCredentials: (ctx, token) => token.resourceServer?.accessTokenTTL || 300,
    Grant: 3600,
    IdToken: 300,
    Interaction: 600,
    Session: 3600,
  },
  async renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = `<!doctype html><html><body><h1>Error</h1>${Object.entries(out)
      .map(([k, v]) => `<p>${escapeHtml(k)}: ${escapeHtml(v)}</p>`).join('')}</body></html>`;
  },
});

// Errors go to the log, which the test fixture shows when something fails.
for (const event of ['authorization.error', 'end_session.error', 'grant.error', 'userinfo.error', 'server_error']) {
  provider.on(event, (ctx, err) => {
    const cause = err.cause ? ` cause=${err.cause.message || err.cause}` : '';
    console.error(`${event}: ${err.message} ${err.error_description || ''}${cause}`);
  });
}

// --- the login form ----------------------------------------------------------------------------
function loginPage(uid, error) {
  return `<!doctype html><html><head><title>Sign in to ${escapeHtml(realm)}</title></head><body>
<h1>Sign in to ${escapeHtml(realm)}</h1>
${error ? `<p class="error">${escapeHtml(error)}</p>` : ''}
<form id="kc-form-login" method="post" action="${prefix}/login-actions/${escapeHtml(uid)}">
  <label>Username <input name="username" autocomplete="username"></label>
  <label>Password <input name="password" type="password" autocomplete="current-password"></label>
  <button type="submit">Sign in</button>
</form></body></html>`;
}

async function readForm(req) {
  let body = '';
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 65536) throw new Error('form too large');
  }
  return new URLSearchParams(body);
}

function send(res, status, html) {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
  res.end(html);
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  if (details.prompt.name !== 'login') {
    // Consent is implied by loadExistingGrant; any other prompt is not part of this realm.
    send(res, 501, `prompt ${escapeHtml(details.prompt.name)} is not supported`);
    return;
  }
  if (req.method === 'GET') {
    send(res, 200, loginPage(details.uid));
    return;
  }
  const form = await readForm(req);
  const username = form.get('username') || '';
  const account = accounts().find((a) => a.username === username);
  const given = Buffer.from(form.get('password') || '');
  const expected = Buffer.from(account?.password || '');
  if (!account || given.length !== expected.length || !given.equals(expected)) {
    send(res, 200, loginPage(details.uid, 'Invalid username or password.'));
    return;
  }
  await provider.interactionFinished(req, res, { login: { accountId: account.sub } }, {
    mergeWithLastSubmission: false,
  });
}

const handle = provider.callback();
const server = http.createServer((req, res) => {
  const url = req.url || '/';
  if (url !== prefix && !url.startsWith(`${prefix}/`) && !url.startsWith(`${prefix}?`)) {
    send(res, 404, 'not found');
    return;
  }
  if (url.startsWith(`${prefix}/login-actions/`)) {
    interaction(req, res).catch((err) => {
      console.error('interaction failed:', err);
      if (!res.headersSent) send(res, 400, `interaction failed: ${escapeHtml(err.message)}`);
    });
    return;
  }
  // Mounted under the realm path the way express mounts it: the provider reads originalUrl
  // to build its own URLs.
  req.originalUrl = url;
  req.url = url.slice(prefix.length) || '/';
  handle(req, res);
});

server.listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider ready issuer=${issuer}`);
});

const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
