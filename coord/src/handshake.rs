//! The coordinator's side of the handshake, as a state machine without I/O.
//!
//! Every connection starts here. The peer says `Hello` (its job, the protocol versions it
//! speaks, its name, role and nonce); the coordinator picks the newest version both speak
//! and answers with a `Challenge` (its own nonce and its proof of knowing the job
//! secret); the peer proves the same in `Auth`, and only then is it handed to the engine.
//! Anything else refuses the peer. Like the engine, [`Handshake::receive`] reads no socket
//! and makes no nonce itself (the caller passes the nonce source), so tests drive it with
//! fixed nonces; the I/O layer (`server`) sends what it returns and keeps the timers.

use crate::addr::PeerAddr;
use crate::auth::{AuthError, Secret};
use crate::protocol::{
    Challenge, Hello, Intent, Message, NONCE_LEN, Role, VERSION_MAX, VERSION_MIN,
};

/// What a connection's handshake waits for next.
#[derive(Debug)]
pub(crate) enum Handshake {
    /// The peer's `Hello`.
    AwaitHello,
    /// The peer's `Auth`, answering the challenge sent for this `Hello`.
    AwaitAuth {
        /// What the peer said it is.
        hello: Box<Hello>,
        /// The nonce of our challenge.
        server_nonce: [u8; NONCE_LEN],
    },
}

/// What peers are checked against: the coordinator's job and its secret.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Verifier<'a> {
    /// The one job this coordinator serves.
    pub(crate) job: &'a str,
    /// The job secret.
    pub(crate) secret: &'a Secret,
}

/// A peer that completed the handshake, as the engine is told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Joined {
    /// Agent, relay or control client.
    pub(crate) role: Role,
    /// Node name (agents) or peer name.
    pub(crate) name: String,
    /// What an agent came for.
    pub(crate) intent: Intent,
}

/// Who is to blame for a refusal, which decides how it is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The peer (wrong job, version or secret, a message out of order): something anyone
    /// can cause at will, so its log line is rate limited.
    Peer,
    /// The coordinator itself (no nonce could be made): always logged.
    Coordinator,
}

/// A refused peer: what it is told and what the coordinator logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The reason sent to the peer (vague for authentication failures).
    pub(crate) reason: &'static str,
    /// The log line, naming the peer.
    pub(crate) line: String,
    /// How the line is logged.
    pub(crate) blame: Blame,
}

/// What to do after one message of the handshake.
#[derive(Debug)]
pub(crate) enum Step {
    /// Send this challenge; the handshake continues in `next`.
    Challenge {
        /// The reply.
        reply: Challenge,
        /// The state to wait in.
        next: Handshake,
    },
    /// Authenticated: the peer goes to the engine.
    Joined(Joined),
    /// Refuse the peer.
    Refuse(Refusal),
}

/// The protocol version to speak with a peer that speaks `min..=max`: the newest both
/// speak, or `None`.
pub(crate) fn negotiate(min: u16, max: u16) -> Option<u16> {
    let version = VERSION_MAX.min(max);
    (version >= VERSION_MIN.max(min)).then_some(version)
}

impl Handshake {
    /// Takes one message from `addr`. `nonce` makes the challenge's nonce; it is only
    /// called once the `Hello` is acceptable.
    pub(crate) fn receive(
        self,
        msg: Message,
        addr: PeerAddr,
        v: Verifier<'_>,
        nonce: impl FnOnce() -> Result<[u8; NONCE_LEN], AuthError>,
    ) -> Step {
        match (self, msg) {
            (Handshake::AwaitHello, Message::Hello(h)) => hello(h, addr, v, nonce),
            (
                Handshake::AwaitAuth {
                    hello,
                    server_nonce,
                },
                Message::Auth(a),
            ) => auth(*hello, &server_nonce, &a.proof, addr, v),
            (_, m) => Step::Refuse(Refusal {
                reason: "protocol violation: handshake expected",
                line: format!(
                    "refused {addr}: {:?} before the handshake completed",
                    m.msg_type()
                ),
                blame: Blame::Peer,
            }),
        }
    }
}

fn refused(reason: &'static str, line: String) -> Step {
    Step::Refuse(Refusal {
        reason,
        line,
        blame: Blame::Peer,
    })
}

fn hello(
    h: Hello,
    addr: PeerAddr,
    v: Verifier<'_>,
    nonce: impl FnOnce() -> Result<[u8; NONCE_LEN], AuthError>,
) -> Step {
    if h.job != v.job {
        return refused(
            "unknown job",
            format!(
                "refused {addr} (node {:?}): job {:?} is not this coordinator's job",
                h.node, h.job
            ),
        );
    }
    let Some(version) = negotiate(h.min_version, h.max_version) else {
        return refused(
            "no common protocol version",
            format!(
                "refused {addr} (node {:?}): no common protocol version ({}..={})",
                h.node, h.min_version, h.max_version
            ),
        );
    };
    let server_nonce = match nonce() {
        Ok(n) => n,
        Err(e) => {
            return Step::Refuse(Refusal {
                reason: "internal error",
                line: format!("cannot make a nonce for {addr}: {e}"),
                blame: Blame::Coordinator,
            });
        }
    };
    let server_proof = v.secret.server_proof(v.job, &h.client_nonce, &server_nonce);
    Step::Challenge {
        reply: Challenge {
            version,
            server_nonce,
            server_proof,
        },
        next: Handshake::AwaitAuth {
            hello: Box::new(h),
            server_nonce,
        },
    }
}

fn auth(
    hello: Hello,
    server_nonce: &[u8; NONCE_LEN],
    proof: &[u8; NONCE_LEN],
    addr: PeerAddr,
    v: Verifier<'_>,
) -> Step {
    let ok = v.secret.verify_client(
        v.job,
        &hello.node,
        hello.role,
        server_nonce,
        &hello.client_nonce,
        proof,
    );
    if !ok {
        return refused(
            "authentication failed",
            format!(
                "refused {addr} (node {:?}, {:?}): authentication failed: wrong or missing job secret",
                hello.node, hello.role
            ),
        );
    }
    Step::Joined(Joined {
        role: hello.role,
        name: hello.node,
        intent: hello.intent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Auth;

    const JOB: &str = "job";
    const CLIENT_NONCE: [u8; NONCE_LEN] = [1; NONCE_LEN];
    const SERVER_NONCE: [u8; NONCE_LEN] = [2; NONCE_LEN];

    fn secret() -> Secret {
        Secret::from_bytes(&[9; 32])
    }

    fn addr() -> PeerAddr {
        PeerAddr::Tcp("192.0.2.1:5000".parse().unwrap())
    }

    fn hello_msg(job: &str, min_version: u16, max_version: u16) -> Message {
        Message::Hello(Hello {
            min_version,
            max_version,
            job: job.to_string(),
            node: "n1".to_string(),
            role: Role::Agent,
            intent: Intent::Checkpoint,
            expect: 0,
            client_nonce: CLIENT_NONCE,
        })
    }

    fn fixed_nonce() -> Result<[u8; NONCE_LEN], AuthError> {
        Ok(SERVER_NONCE)
    }

    fn refusal(step: Step) -> Refusal {
        match step {
            Step::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// The state after a good `Hello`, and the challenge sent for it.
    fn challenged(s: &Secret) -> (Handshake, Challenge) {
        let v = Verifier {
            job: JOB,
            secret: s,
        };
        let step = Handshake::AwaitHello.receive(
            hello_msg(JOB, VERSION_MIN, VERSION_MAX),
            addr(),
            v,
            fixed_nonce,
        );
        match step {
            Step::Challenge { reply, next } => (next, reply),
            other => panic!("expected a challenge, got {other:?}"),
        }
    }

    #[test]
    fn the_newest_common_version_is_chosen() {
        assert_eq!(negotiate(VERSION_MIN, VERSION_MAX + 5), Some(VERSION_MAX));
        assert_eq!(negotiate(0, VERSION_MAX), Some(VERSION_MAX));
        assert_eq!(negotiate(VERSION_MAX + 1, VERSION_MAX + 3), None);
        assert_eq!(negotiate(0, VERSION_MIN - 1), None);
    }

    #[test]
    fn a_peer_with_the_secret_joins() {
        let s = secret();
        let (state, challenge) = challenged(&s);
        assert_eq!(challenge.version, VERSION_MAX);
        assert_eq!(challenge.server_nonce, SERVER_NONCE);
        // The peer can check that we know the secret too.
        assert!(s.verify_server(JOB, &CLIENT_NONCE, &SERVER_NONCE, &challenge.server_proof));
        let proof = s.client_proof(JOB, "n1", Role::Agent, &SERVER_NONCE, &CLIENT_NONCE);
        let v = Verifier {
            job: JOB,
            secret: &s,
        };
        match state.receive(Message::Auth(Auth { proof }), addr(), v, fixed_nonce) {
            Step::Joined(j) => assert_eq!(
                j,
                Joined {
                    role: Role::Agent,
                    name: "n1".to_string(),
                    intent: Intent::Checkpoint,
                }
            ),
            other => panic!("expected to join, got {other:?}"),
        }
    }

    #[test]
    fn a_wrong_proof_is_refused_vaguely() {
        let s = secret();
        let (state, _) = challenged(&s);
        let other = Secret::from_bytes(&[8; 32]);
        let proof = other.client_proof(JOB, "n1", Role::Agent, &SERVER_NONCE, &CLIENT_NONCE);
        let v = Verifier {
            job: JOB,
            secret: &s,
        };
        let r = refusal(state.receive(Message::Auth(Auth { proof }), addr(), v, fixed_nonce));
        assert_eq!(r.reason, "authentication failed");
        assert_eq!(r.blame, Blame::Peer);
        assert!(r.line.contains("192.0.2.1:5000"), "{}", r.line);
    }

    #[test]
    fn a_wrong_job_or_version_is_refused_before_any_nonce() {
        let s = secret();
        let v = Verifier {
            job: JOB,
            secret: &s,
        };
        let no_nonce = || -> Result<[u8; NONCE_LEN], AuthError> { panic!("no nonce wanted") };
        let r = refusal(Handshake::AwaitHello.receive(
            hello_msg("other", VERSION_MIN, VERSION_MAX),
            addr(),
            v,
            no_nonce,
        ));
        assert_eq!(r.reason, "unknown job");
        let r = refusal(Handshake::AwaitHello.receive(
            hello_msg(JOB, VERSION_MAX + 1, VERSION_MAX + 1),
            addr(),
            v,
            no_nonce,
        ));
        assert_eq!(r.reason, "no common protocol version");
    }

    #[test]
    fn a_message_out_of_order_is_refused() {
        let s = secret();
        let v = Verifier {
            job: JOB,
            secret: &s,
        };
        let auth_first = Message::Auth(Auth {
            proof: [0; NONCE_LEN],
        });
        let r = refusal(Handshake::AwaitHello.receive(auth_first, addr(), v, fixed_nonce));
        assert_eq!(r.reason, "protocol violation: handshake expected");
        let (state, _) = challenged(&s);
        let hello_again = hello_msg(JOB, VERSION_MIN, VERSION_MAX);
        let r = refusal(state.receive(hello_again, addr(), v, fixed_nonce));
        assert_eq!(r.reason, "protocol violation: handshake expected");
    }

    #[test]
    fn no_nonce_is_the_coordinators_fault() {
        let s = secret();
        let v = Verifier {
            job: JOB,
            secret: &s,
        };
        let r = refusal(Handshake::AwaitHello.receive(
            hello_msg(JOB, VERSION_MIN, VERSION_MAX),
            addr(),
            v,
            || Err(AuthError::Random("no entropy".to_string())),
        ));
        assert_eq!(r.reason, "internal error");
        assert_eq!(r.blame, Blame::Coordinator);
    }
}
